"""Collection loaders: SciFact counts and parsing, BEIR / MS MARCO / TREC round trips, and every
malformed input refused with file, record and field (in-process and through `main`)."""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import zipfile

import pytest

from bilinear_ir.data import loaders
from bilinear_ir.data import msmarco
from bilinear_ir.data import scifact as scifact_lib
from bilinear_ir.config.blocks import data_config
from bilinear_ir.errors import InputError
from bilinear_ir.jobs import collection_stats
from conftest import expect_located, get_config


def _config(fmt: str, path: str):
  c = data_config()
  c.format, c.path = fmt, path
  return c


@pytest.fixture(scope="module")
def scifact():
  return loaders.load(data_config())


# ---------------------------------------------------------------------------------------------
# SciFact (embedded zip).


def test_scifact_counts(scifact):
  c = scifact
  assert c.num_docs == 5183 and len(set(c.doc_ids)) == 5183
  assert sorted(c.qrels) == ["test", "train"]
  for split, queries, pairs in (("train", 809, 919), ("test", 300, 339)):
    assert len(c.qrels[split]) == queries
    assert sum(len(d) for d in c.qrels[split].values()) == pairs
    assert {r for d in c.qrels[split].values() for r in d.values()} == {1}
  assert not set(c.qrels["train"]) & set(c.qrels["test"])
  docs = set(c.doc_ids)
  assert all(d in docs for s in c.qrels.values() for judged in s.values() for d in judged)
  assert set(c.queries) == set(c.qrels["train"]) | set(c.qrels["test"])
  assert c.candidates == {} and c.triples_path == ""


def _raw_corpus_rows() -> dict[str, dict[str, str]]:
  with zipfile.ZipFile(scifact_lib.embedded_scifact_path()) as zf:
    text = zf.read("corpus_train.csv").decode("utf-8")
  return {r["doc_id"]: r for r in csv.DictReader(io.StringIO(text, newline=""))}


def test_scifact_abstracts_match_raw_csv(scifact):
  raw = _raw_corpus_rows()
  row = scifact.doc_index()
  # Adjacent literals on one line ('24.0 +/-' '4.44 ...') are two sentences.
  i = row["4983"]
  assert scifact.titles[i] == raw["4983"]["title"]
  assert scifact.texts[i].startswith(
      "Alterations of the architecture of cerebral white matter in the developing human brain "
      "can affect cortical development and result in functional disabilities. A line scan ")
  assert ("(1.4 +/- 0.24 versus 1.15 +/- 0.09 microm2/ms, p = 0.016)" in scifact.texts[i])
  assert "internal capsule, 24.0 +/- 4.44 versus 33.1 +/- 0.6% p = 0.006)." in scifact.texts[i]
  assert scifact.texts[i].endswith("microstructural development in cerebral white matter in "
                                   "living infants.")
  # A double-quoted literal with an apostrophe inside.
  i = row["103007"]
  assert scifact.texts[i] == (
      "The current reference curves of stature and weight for the UK were first published in "
      "1966 and have been used ever since despite increasing concern that they may not "
      "adequately describe the growth of present day British children. Using current data from "
      "seven sources new reference curves have been estimated from birth to 20 years for "
      "children in 1990. The great majority of the data are nationally representative. The "
      "analysis used Cole's LMS method and has produced efficient estimates of the conventional "
      "centiles and gives a good fit to the data. These curves differ from the currently used "
      "curves at key ages for both stature and weight. In view of the concerns expressed about "
      "the current curves and the differences between them and the new curves, it is proposed "
      "that the curves presented here should be adopted as the new UK reference curves.")
  # An escaped newline inside a literal becomes a real newline.
  assert "computational methods.   \n RESULTS We present NucHunter" in scifact.texts[row["175735"]]
  # Brute-force twin on every doc: sentences as single-quoted literals without escapes.
  simple = re.compile(r"^\[('[^'\\\n]*'(\n? ))*'[^'\\\n]*'\]$")
  checked = 0
  for doc_id, r in raw.items():
    if simple.match(r["abstract"]):
      expect = " ".join(re.findall(r"'([^'\\\n]*)'", r["abstract"]))
      assert scifact.texts[row[doc_id]] == expect, doc_id
      checked += 1
  assert checked > 3000


def test_embedded_zip_matches_source_txt():
  folder = os.path.dirname(scifact_lib.embedded_scifact_path())
  with open(os.path.join(folder, "SOURCE.txt"), encoding="utf-8") as f:
    documented = re.search(r"SHA-256 ([0-9a-f]{64})", f.read()).group(1)
  with open(scifact_lib.embedded_scifact_path(), "rb") as f:
    assert hashlib.sha256(f.read()).hexdigest() == documented


def _scifact_zip(path, members: dict[str, str]) -> str:
  with zipfile.ZipFile(path, "w") as zf:
    for name, text in members.items():
      zf.writestr(name, text)
  return str(path)


_CORPUS = ("doc_id,title,abstract,structured\n1,T one,\"['A b.'\n 'C d.']\",False\n"
           "2,T two,[],False\n")
_CLAIMS = "id,claim,evidence_doc_id,evidence_label,evidence_sentences,cited_doc_ids\n"


def test_scifact_from_user_zip(tmp_path):
  path = _scifact_zip(tmp_path / "s.zip", {
      "corpus_train.csv": _CORPUS,
      "claims_train.csv": (_CLAIMS + "5,claim five,1,SUPPORT,[0],[1 2]\n"
                           "5,claim five,2,SUPPORT,[],[1 2]\n"),
      "claims_validation.csv": _CLAIMS + "9,claim nine,,,[],[2]\n",
  })
  c = loaders.load(_config("scifact", path))
  assert c.doc_ids == ["1", "2"] and c.titles == ["T one", "T two"] and c.texts == ["A b. C d.", ""]
  assert c.queries == {"5": "claim five", "9": "claim nine"}
  assert c.qrels == {"train": {"5": {"1": 1, "2": 1}}, "test": {"9": {"2": 1}}}


# ---------------------------------------------------------------------------------------------
# Round trips of tiny written files.


def _write(path, text: str | bytes) -> str:
  os.makedirs(os.path.dirname(str(path)), exist_ok=True)
  with open(path, "wb") as f:
    f.write(text if isinstance(text, bytes) else text.encode("utf-8"))
  return str(path)


BEIR_DOCS = [("d1", "Title one", "first text"), ("d2", "", "second — text"),
             ("d3", "Only title", "")]
BEIR_QUERIES = [("q1", "what is one"), ("q2", "two?"), ("q3", "unjudged")]


def _beir(folder, docs=BEIR_DOCS, queries=BEIR_QUERIES, qrels=None) -> str:
  qrels = qrels or {"train": [("q1", "d1", 1), ("q1", "d3", 0)], "test": [("q2", "d2", 2)]}
  _write(folder / "corpus.jsonl", "".join(
      json.dumps({"_id": i, "title": t, "text": x}, ensure_ascii=False) + "\n" for i, t, x in docs))
  _write(folder / "queries.jsonl", "".join(
      json.dumps({"_id": i, "text": t, "metadata": {}}) + "\n" for i, t in queries))
  for split, rows in qrels.items():
    _write(folder / "qrels" / f"{split}.tsv",
           "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{r}\n" for q, d, r in rows))
  return str(folder)


def test_beir_round_trip(tmp_path):
  c = loaders.load(_config("beir", _beir(tmp_path / "mini")))
  assert c.name == "mini"
  assert list(zip(c.doc_ids, c.titles, c.texts)) == BEIR_DOCS
  assert c.queries == dict(BEIR_QUERIES)
  assert c.qrels == {"train": {"q1": {"d1": 1, "d3": 0}}, "test": {"q2": {"d2": 2}}}
  assert c.doc_strings() == ["Title one first text", "second — text", "Only title"]


def _zip_folder(folder: str, zip_path: str, top: str = "") -> str:
  """Zips every file of `folder` under `top` (e.g. "mini/", as BEIR's downloads do)."""
  with zipfile.ZipFile(zip_path, "w") as zf:
    for dirpath, _, names in os.walk(folder):
      for name in names:
        full = os.path.join(dirpath, name)
        zf.write(full, top + os.path.relpath(full, folder).replace(os.sep, "/"))
  return zip_path


@pytest.mark.parametrize("top", ["", "mini/"])
def test_beir_zip_reads_as_the_folder_does(tmp_path, top):
  folder = _beir(tmp_path / "mini")
  c = loaders.load(_config("beir", _zip_folder(folder, str(tmp_path / "mini.zip"), top)))
  d = loaders.load(_config("beir", folder))
  assert c.name == "mini"
  assert (c.doc_ids, c.titles, c.texts, c.queries, c.qrels) == (
      d.doc_ids, d.titles, d.texts, d.queries, d.qrels)


def test_beir_zip_problems_name_the_member(tmp_path):
  folder = _beir(tmp_path / "mini")
  os.remove(os.path.join(folder, "queries.jsonl"))
  z = _zip_folder(folder, str(tmp_path / "noq.zip"))
  with pytest.raises(InputError, match="member 'queries.jsonl'"):
    loaders.load(_config("beir", z))
  bad = str(tmp_path / "bad.zip")
  with zipfile.ZipFile(bad, "w") as zf:
    zf.writestr("corpus.jsonl", '{"_id": "d1", "text": "x"}\n')
    zf.writestr("../evil.txt", "x")
  with pytest.raises(InputError, match="evil"):
    loaders.load(_config("beir", bad))
  broken = _beir(tmp_path / "broken")
  _write(tmp_path / "broken" / "corpus.jsonl", '{"_id": "d1", "text": 3}\n')
  with pytest.raises(InputError, match=r"broken\.zip/corpus\.jsonl: line 1: field 'text'"):
    loaders.load(_config("beir", _zip_folder(broken, str(tmp_path / "broken.zip"))))


def _msmarco(folder) -> str:
  _write(folder / "collection.tsv", "0\tpassage zero\n1\tpassage one\n2\tpassage two\n"
         "3\tpassage zero\n")
  _write(folder / "queries.train.tsv", "10\tquery ten\n11\tquery eleven\n")
  _write(folder / "queries.dev.tsv", "20\tquery twenty\n21\tquery twenty-one\n")
  _write(folder / "queries.dev.small.tsv", "20\tquery twenty\n")  # repeats queries.dev.tsv
  _write(folder / "queries.eval.tsv", "30\tno qrels: never read\n")
  _write(folder / "qrels.train.tsv", "10\t0\t1\t1\n11\t0\t3\t1\n")
  _write(folder / "qrels.dev.tsv", "20\t0\t2\t1\n21\t0\t0\t1\n")
  _write(folder / "qrels.dev.small.tsv", "20 0 2 1\n")
  _write(folder / "top1000.dev.tsv", "20\t2\tquery twenty\tpassage two\n"
         "20\t0\tquery twenty\tpassage zero\n21\t1\tquery twenty-one\tpassage one\n")
  _write(folder / "triples.train.small.tsv", "query ten\tpassage one\tpassage two\n"
         "query eleven\tpassage zero\tpassage one\n")
  return str(folder)


def test_msmarco_round_trip(tmp_path):
  c = loaders.load(_config("msmarco", _msmarco(tmp_path / "marco")))
  assert c.doc_ids == ["0", "1", "2", "3"] and c.titles == [""] * 4
  assert c.texts == ["passage zero", "passage one", "passage two", "passage zero"]
  assert c.queries == {"10": "query ten", "11": "query eleven", "20": "query twenty",
                       "21": "query twenty-one"}
  assert c.qrels == {"dev": {"20": {"2": 1}, "21": {"0": 1}}, "dev.small": {"20": {"2": 1}},
                     "train": {"10": {"1": 1}, "11": {"3": 1}}}
  assert c.candidates == {"dev": {"20": ["2", "0"], "21": ["1"]}}
  assert c.triples_path == os.path.join(str(tmp_path / "marco"), "triples.train.small.tsv")
  # Triples: ids resolved by text; 'passage zero' is docs 0 and 3, the judged one (3) is chosen.
  assert list(msmarco.msmarco_triples(c, "train")) == [(1, "10", "1", "2"), (2, "11", "3", "1")]


def test_msmarco_optional_files_and_conflicting_queries(tmp_path):
  folder = _msmarco(tmp_path / "marco")
  for name in ("top1000.dev.tsv", "triples.train.small.tsv"):
    os.remove(os.path.join(folder, name))
  c = loaders.load(_config("msmarco", folder))
  assert c.candidates == {} and c.triples_path == ""
  _write(tmp_path / "marco" / "top1000.dev.tsv", "20\t2\tquery twenty\tpassage two\n"
         "99\t0\tquery 99\tpassage zero\n")
  with pytest.raises(InputError, match=r"top1000\.dev\.tsv: line 2: field 'qid': unknown query"):
    loaders.load(_config("msmarco", folder))
  os.remove(os.path.join(folder, "top1000.dev.tsv"))
  # The same qid in two query files must have the same text.
  _write(tmp_path / "marco" / "queries.dev.small.tsv", "20\tquery 20 reworded\n")
  with pytest.raises(InputError, match=r"queries\.dev\.tsv: line 1: field 'qid': "
                     r"duplicate query id '20' \(first in .*queries\.dev\.small\.tsv\)"):
    loaders.load(_config("msmarco", folder))


def test_msmarco_triples_refuse_unjudged_positive(tmp_path):
  folder = _msmarco(tmp_path / "marco")
  _write(tmp_path / "marco" / "triples.train.small.tsv", "query ten\tpassage one\tpassage two\n"
         "query ten\tpassage two\tpassage one\n")
  c = loaders.load(_config("msmarco", folder))
  with pytest.raises(InputError, match=r"triples\.train\.small\.tsv: line 2: field 'positive'"):
    list(msmarco.msmarco_triples(c, "train"))


ROBUST_DOCS = {
    "a.sgml": "<DOC>\n<DOCNO> FT911-1 </DOCNO>\n<HEADLINE>\nFT  Big <B>news</B>\n</HEADLINE>\n"
              "<TEXT>\nFirst   paragraph.\n<P>Second</P>\n</TEXT>\n</DOC>\n"
              "<DOC>\n<DOCNO>FT911-2</DOCNO>\n<TEXT>No title here.</TEXT>\n</DOC>\n",
    "b.sgml": "<DOC>\n<DOCNO>LA-3</DOCNO>\n<HEAD>Head line</HEAD>\n<TEXT>Body &amp; more"
              "</TEXT>\n</DOC>\n",
}
ROBUST_TOPICS = ("<top>\n<num> Number: 301\n<title> International Organized Crime\n\n"
                 "<desc> Description:\nIdentify organizations.\n\n<narr> Narrative:\nA relevant"
                 " document.\n</top>\n\n<top>\n<num> Number: 302 \n<title> Poliomyelitis and "
                 "Post-Polio\n<desc> Description:\nx\n</top>\n")


def _robust(folder) -> str:
  for name, text in ROBUST_DOCS.items():
    _write(folder / "docs" / name, text)
  _write(folder / "topics.test.txt", ROBUST_TOPICS)
  _write(folder / "qrels.test.txt", "301 0 FT911-1 1\n301 0 LA-3 0\n302 0 FT911-2 2\n")
  return str(folder)


def test_trec_robust_round_trip(tmp_path):
  c = loaders.load(_config("trec", _robust(tmp_path / "robust04")))
  assert c.doc_ids == ["FT911-1", "FT911-2", "LA-3"]
  assert c.titles == ["FT Big news", "", "Head line"]
  assert c.texts == ["First paragraph. Second", "No title here.", "Body &amp; more"]
  assert c.queries == {"301": "International Organized Crime",
                       "302": "Poliomyelitis and Post-Polio"}
  assert c.qrels == {"test": {"301": {"FT911-1": 1, "LA-3": 0}, "302": {"FT911-2": 2}}}


def test_trec_car_round_trip(tmp_path):
  folder = tmp_path / "car"
  _write(folder / "paragraphs.tsv", "p1\tAftertaste is a taste.\np2\tWine tasting.\n")
  _write(folder / "queries.train.tsv", "enwiki:Aftertaste\tAftertaste\n"
         "enwiki:Aftertaste/Wine\tAftertaste wine\n")
  _write(folder / "qrels.train.txt", "enwiki:Aftertaste 0 p1 1\nenwiki:Aftertaste/Wine 0 p2 1\n")
  c = loaders.load(_config("trec", str(folder)))
  assert list(zip(c.doc_ids, c.texts)) == [("p1", "Aftertaste is a taste."),
                                           ("p2", "Wine tasting.")]
  assert c.queries == {"enwiki:Aftertaste": "Aftertaste",
                       "enwiki:Aftertaste/Wine": "Aftertaste wine"}
  assert c.qrels == {"train": {"enwiki:Aftertaste": {"p1": 1}, "enwiki:Aftertaste/Wine": {"p2": 1}}}


def test_stats_job_counts(tmp_path, repo_root):
  config = get_config("collection_stats", f"format=beir,path={_beir(tmp_path / 'mini')}")
  results = collection_stats.run(config, str(tmp_path / "w")).results
  assert results["docs"] == 3 and results["queries"] == 3
  assert results["avg_doc_words"] == pytest.approx((4 + 3 + 2) / 3)
  assert results["splits"] == {
      "test": {"queries": 1, "qrels": 1, "relevant": 1, "avg_query_words": 1.0},
      "train": {"queries": 1, "qrels": 2, "relevant": 1, "avg_query_words": 3.0}}


# ---------------------------------------------------------------------------------------------
# Malformed inputs: each case writes a folder, names the format and what the message must name.


def _jsonl_docs(*lines: str) -> str:
  return "".join(line + "\n" for line in lines)


def _beir_with(folder, file: str, content: str | bytes) -> str:
  _beir(folder)
  _write(folder / file, content)
  return str(folder)


def _case_zip_traversal(folder):
  os.makedirs(folder)
  return _scifact_zip(folder / "evil.zip", {"../corpus_train.csv": _CORPUS})


def _case_scifact_unknown_cited(folder):
  os.makedirs(folder)
  return _scifact_zip(folder / "s.zip", {
      "corpus_train.csv": _CORPUS, "claims_train.csv": _CLAIMS + "5,c,,,[],[7]\n",
      "claims_validation.csv": _CLAIMS})


def _case_robust_undecodable(folder):
  _robust(folder)
  _write(folder / "docs" / "b.sgml", b"<DOC>\n<DOCNO>LA-3</DOCNO>\n<TEXT>caf\xe9</TEXT>\n</DOC>\n")
  return str(folder)


def _case_robust_no_docno(folder):
  _robust(folder)
  _write(folder / "docs" / "b.sgml", "<DOC>\n<DOCNO>LA-3</DOCNO>\n<TEXT>x</TEXT>\n</DOC>\n"
         "<DOC>\n<TEXT>y</TEXT>\n</DOC>\n")
  return str(folder)


def _case_topic_no_title(folder):
  _robust(folder)
  _write(folder / "topics.test.txt", "<top>\n<num> Number: 301\n<desc> x\n</top>\n")
  return str(folder)


def _case_msmarco(file: str, content: str | bytes):
  def make(folder):
    _msmarco(folder)
    _write(folder / file, content)
    return str(folder)
  return make


# (id, format, make(folder) -> path, file named, record named, field named)
MALFORMED = [
    ("dup_doc", "beir", lambda f: _beir(f, docs=BEIR_DOCS + [("d2", "t", "x")]),
     "corpus.jsonl", "line 4", "_id"),
    ("dup_query", "beir", lambda f: _beir(f, queries=BEIR_QUERIES + [("q1", "again")]),
     "queries.jsonl", "line 4", "_id"),
    ("qrels_unknown_doc", "beir",
     lambda f: _beir(f, qrels={"test": [("q1", "d1", 1), ("q2", "d9", 1)]}),
     "test.tsv", "line 3", "corpus-id"),
    ("qrels_unknown_query", "beir", lambda f: _beir(f, qrels={"test": [("q7", "d1", 1)]}),
     "test.tsv", "line 2", "query-id"),
    ("empty_doc", "beir", lambda f: _beir(f, docs=BEIR_DOCS + [("d4", " ", "")]),
     "corpus.jsonl", "line 4", "text"),
    ("broken_json", "beir", lambda f: _beir_with(f, "corpus.jsonl", _jsonl_docs(
        '{"_id": "d1", "text": "x"}', '{"_id": "d2", "text": "y"')),
     "corpus.jsonl", "line 2", "json"),
    ("missing_key", "beir", lambda f: _beir_with(f, "corpus.jsonl", _jsonl_docs(
        '{"_id": "d1", "title": "x"}')), "corpus.jsonl", "line 1", "text"),
    ("non_int_relevance", "beir", lambda f: _beir(f, qrels={"test": [("q1", "d1", "1.5")]}),
     "test.tsv", "line 2", "score"),
    ("qrels_header", "beir", lambda f: _beir_with(f, "qrels/test.tsv", "q1\td1\t1\n"),
     "test.tsv", "line 1", "query-id"),
    ("undecodable_json", "beir", lambda f: _beir_with(
        f, "corpus.jsonl",
        b'{"_id": "d1", "text": "x"}\n{"_id": "d2", "title": "caf\xe9", "text": "y"}\n'),
     "corpus.jsonl", "line 2", "title"),
    ("missing_file", "beir", lambda f: (_beir(f), os.remove(f / "queries.jsonl"))[0],
     "queries.jsonl", "", ""),
    ("undecodable_tsv", "msmarco", _case_msmarco("collection.tsv", b"0\tok\n1\tbad \xff\n"),
     "collection.tsv", "line 2", "passage"),
    ("missing_column", "msmarco", _case_msmarco("queries.train.tsv", "10\tquery ten\n11\n"),
     "queries.train.tsv", "line 2", "query"),
    ("trec_qrels_non_int", "msmarco", _case_msmarco("qrels.train.tsv", "10 0 1 yes\n"),
     "qrels.train.tsv", "line 1", "relevance"),
    ("sgml_undecodable", "trec", _case_robust_undecodable, "b.sgml", "line 3", "TEXT"),
    ("sgml_no_docno", "trec", _case_robust_no_docno, "b.sgml", "line 5", "DOCNO"),
    ("topic_no_title", "trec", _case_topic_no_title, "topics.test.txt", "line 1", "title"),
    ("zip_traversal", "scifact", _case_zip_traversal, "evil.zip", "'../corpus_train.csv'", ""),
    ("scifact_unknown_cited", "scifact", _case_scifact_unknown_cited,
     "claims_train.csv", "line 2", "cited_doc_ids"),
]


@pytest.mark.parametrize("case", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_input_raises_located_error(tmp_path, case):
  _, fmt, make, file, record, field = case
  path = make(tmp_path / "bad")
  with pytest.raises(InputError) as e:
    loaders.load(_config(fmt, path))
  expect_located(str(e.value), file, record, field)


def test_unknown_format_and_missing_path(tmp_path):
  with pytest.raises(InputError, match="field 'data.format'"):
    loaders.load(_config("csv", str(tmp_path)))
  with pytest.raises(InputError, match="field 'data.path'"):
    loaders.load(_config("beir", ""))
  with pytest.raises(InputError, match="no such file"):
    loaders.load(_config("beir", str(tmp_path / "nothing")))


# ---------------------------------------------------------------------------------------------
# Through `main`: exit code 2, one line on stderr, no results written.


def _stats_flags(fmt: str, path: str) -> tuple[str, ...]:
  return ("configs/collection_stats.py", f"--config.data.format={fmt}",
          f"--config.data.path={path}")


@pytest.mark.parametrize("case", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_main_exits_2_on_malformed_input(tmp_path, run_main, case):
  _, fmt, make, file, record, field = case
  config, *flags = _stats_flags(fmt, make(tmp_path / "bad"))
  expect_located(run_main(config, tmp_path / "w", *flags).one_error_line(), file, record, field)


def test_main_writes_stats(tmp_path, run_main):
  workdir = tmp_path / "w"
  config, *flags = _stats_flags("beir", _beir(tmp_path / "mini"))
  results = run_main.in_process(config, workdir, *flags)
  assert results["docs"] == 3
  assert {s: v["qrels"] for s, v in results["splits"].items()} == {"test": 1, "train": 2}


# ---------------------------------------------------------------------------------------------
# The record limit (`data.max_record_mib`): a longer line is an input error, read no further.

_MIB = 1 << 20


@pytest.mark.parametrize("fmt,file,line,make", [
    ("beir", "corpus.jsonl", 2, lambda f, pad: _beir_with(f, "corpus.jsonl", _jsonl_docs(
        '{"_id": "d1", "text": "x"}', '{"_id": "d2", "text": "' + pad + '"}'))),
    ("beir", "test.tsv", 3, lambda f, pad: _beir(f, qrels={"test": [("q1", "d1", 1),
                                                                 ("q2", "d2" + pad, 1)]})),
    ("msmarco", "collection.tsv", 2, lambda f, pad: _case_msmarco(
        "collection.tsv", f"0\tok\n1\t{pad}\n")(f)),
    ("msmarco", "qrels.train.tsv", 2, lambda f, pad: _case_msmarco(
        "qrels.train.tsv", f"10\t0\t1\t1\n11 0 3{pad}\t1\n")(f)),
])
def test_a_line_longer_than_the_record_limit_is_a_located_error(tmp_path, fmt, file, line,
                                                                make):
  """JSONL, TSV and TREC qrels: a line over `data.max_record_mib` (1 MiB here) is an
  `InputError` naming the file and the line; at the limit, a record is read as any other."""
  config = _config(fmt, make(tmp_path / "over", "a" * _MIB))
  config.max_record_mib = 1
  with pytest.raises(InputError) as e:
    loaders.load(config)
  expect_located(str(e.value), file, f"line {line}:", "")
  assert "longer than 1 MiB" in str(e.value)
  under = _config(fmt, make(tmp_path / "under", "a" * (_MIB - 64)))
  under.max_record_mib = 1
  try:  # just under the limit the line is read to its end (what it holds may be refused)
    loaders.load(under)
  except InputError as e:
    assert "longer than" not in str(e), e


def test_scifact_members_are_read_up_to_the_record_limit():
  config = data_config()
  config.max_record_mib = 4  # corpus_train.csv inflates to 7.7 MiB
  with pytest.raises(InputError, match=r"scifact\.zip: member 'corpus_train\.csv': member "
                                       r"larger than 4 MiB"):
    loaders.load(config)


def test_a_trec_doc_longer_than_the_record_limit_is_a_located_error(tmp_path):
  """TREC SGML streams `<DOC>` by `<DOC>`: a doc of short lines longer than the limit in all is
  refused at the line it starts on; the docs around it read as usual below the limit."""
  def folder(name, lines):
    f = tmp_path / name
    _robust(f)
    _write(f / "docs" / "b.sgml", "<DOC>\n<DOCNO>LA-9</DOCNO><TEXT>x</TEXT>\n</DOC>\n<DOC>\n"
           "<DOCNO>LA-3</DOCNO>\n<TEXT>\n" + ("word " * 200 + "\n") * lines + "</TEXT>\n</DOC>\n")
    config = _config("trec", str(f))
    config.max_record_mib = 1
    return config
  with pytest.raises(InputError) as e:
    loaders.load(folder("over", 1100))  # 1,100 lines of 1,001 bytes: over 1 MiB
  expect_located(str(e.value), "b.sgml", "line 4:", "")
  assert "a record longer than 1 MiB" in str(e.value)
  c = loaders.load(folder("under", 1000))
  assert c.doc_ids[-2:] == ["LA-9", "LA-3"] and c.texts[-1] == " ".join(["word"] * 200_000)
