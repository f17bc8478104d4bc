"""Built-in tools: python_code in roll's sandbox, BM25 search over a local file, the registry."""

from __future__ import annotations

import json

import pytest

from roll.agentic.tools import TOOLS, Tool, ToolResult, ToolSpec, check_tool, make_tool, register_tool
from roll.agentic.tools.search import BM25Index, SearchTool
from roll.runtime import ConfigError

DOCS = [
    {"id": "ray", "title": "Ray", "text": "Ray is a framework for distributed Python applications and actors."},
    {"id": "torch", "title": "PyTorch", "text": "PyTorch is a tensor library with automatic differentiation."},
    {"id": "sokoban", "title": "Sokoban", "text": "Sokoban is a puzzle where a player pushes boxes onto targets."},
    {"id": "vllm", "title": "vLLM", "text": "vLLM serves large language models with paged attention."},
]


def test_python_code_runs_in_the_sandbox() -> None:
    tool = make_tool("python_code", timeout_s=10)
    assert tool.specs()[0].name == "python_code"
    assert tool.call("python_code", {"code": "print(347 * 29)"}) == ToolResult(True, "10063\n")
    failed = tool.call("python_code", {"code": "1/0"})
    assert not failed.ok and "ZeroDivisionError" in failed.output
    assert not tool.call("python_code", {"code": ""}).ok
    # The sandbox has no network.
    blocked = tool.call("python_code", {"code": "import socket; socket.create_connection(('1.1.1.1', 80), 2)"})
    assert not blocked.ok


def test_python_code_failures_say_why_after_the_clipped_output() -> None:
    """The reason a run failed follows the printed output, which is clipped alone: a long print no longer hides the
    error, and a timeout is named as one, not as the last line the program wrote to stderr."""
    tool = make_tool("python_code", timeout_s=2, max_output_chars=50)
    long = tool.call("python_code", {"code": "for i in range(300): print(i)\n1/0"})
    assert not long.ok and long.output.endswith("...(truncated)\nError: ZeroDivisionError: division by zero")
    slow = tool.call("python_code", {"code": "import sys, time; print('slow', file=sys.stderr); time.sleep(30)"})
    assert not slow.ok and slow.output == "Error: timeout after 2 s"


def test_bm25_ranks_the_matching_document_first(tmp_path) -> None:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("\n".join(json.dumps(d) for d in DOCS))
    tool = SearchTool(corpus_path=str(corpus), top_k=2)
    result = tool.call("search", {"query": "push boxes puzzle"})
    assert result.ok and result.output.splitlines()[0].startswith("[1] Sokoban:")
    hits = BM25Index(DOCS).search("distributed actors", top_k=4)
    assert next(h.doc_id for h in hits) == "ray" and all(h.score > 0 for h in hits)
    assert tool.call("search", {"query": "zebra"}) == ToolResult(True, "No results.")
    assert not tool.call("search", {}).ok


def test_bm25_scores_match_the_formula() -> None:
    docs = [{"id": "a", "title": "", "text": "cat cat dog"}, {"id": "b", "title": "", "text": "dog"}]
    import math

    avg = (3 + 1) / 2
    idf_cat = math.log(1 + (2 - 1 + 0.5) / (1 + 0.5))
    tf = 2
    expected = idf_cat * tf * 2.5 / (tf + 1.5 * (1 - 0.75 + 0.75 * 3 / avg))
    hits = BM25Index(docs).search("cat", top_k=5)
    assert [h.doc_id for h in hits] == ["a"] and hits[0].score == pytest.approx(expected)


def test_bm25_finds_chinese_and_japanese_words_inside_sentences() -> None:
    # a run of Han characters was one token: a query found only a document with that very run ("No results.")
    docs = [
        {"id": "paris", "title": "巴黎", "text": "巴黎是法国的首都。"},
        {"id": "rome", "title": "罗马", "text": "罗马是意大利的首都。"},
        {"id": "tokyo", "title": "東京", "text": "東京は日本の首都です。"},
        {"id": "ray", "title": "Ray", "text": "Ray runs distributed Python actors."},
    ]
    index = BM25Index(docs)
    assert [hit.doc_id for hit in index.search("法国的首都是哪里", 2)] == ["paris", "rome"]
    assert index.search("日本の首都", 1)[0].doc_id == "tokyo"
    assert [hit.doc_id for hit in index.search("python actors", 3)] == ["ray"]  # words elsewhere as before


def test_a_clipped_passage_says_it_was_clipped() -> None:
    # wiki-18 passages (~100 words) run past the default 500 characters: they were cut mid-word without a note
    long = " ".join(["Paris"] * 120)
    tool = SearchTool(
        backend="roll.agentic.tools.search:BM25Index", backend_kwargs={"documents": [{"id": "0", "text": long}]}
    )
    for action_format in ("hermes", "gem"):
        tool.action_format = action_format
        output = tool.call("search", {"query": "Paris"}).output
        assert long[:500] + " ...(truncated)" in output and long not in output
    assert (
        SearchTool(
            backend="roll.agentic.tools.search:BM25Index", backend_kwargs={"documents": [{"id": "0", "text": "Paris"}]}
        )
        .call("search", {"query": "Paris"})
        .output
        == "[1] Paris"
    )


def test_plain_text_corpus_and_custom_backend(tmp_path) -> None:
    corpus = tmp_path / "docs.txt"
    corpus.write_text("alpha beta\n\ngamma delta\n")
    assert SearchTool(corpus_path=str(corpus)).call("search", {"query": "gamma"}).output == "[1] gamma delta"
    tool = SearchTool(backend=f"{__name__}:EchoBackend", backend_kwargs={"prefix": ">"})
    assert tool.call("search", {"query": "hi"}).output == "[1] > hi"
    with pytest.raises(ConfigError, match="corpus_path"):
        SearchTool()


class EchoBackend:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def search(self, query, top_k):
        from roll.agentic.tools.search import SearchHit

        return [SearchHit("0", "", f"{self.prefix} {query}", 1.0)]


class UpperTool(Tool):
    def __init__(self, suffix: str = "") -> None:
        self.suffix = suffix

    def specs(self):
        return [ToolSpec("upper", "Upper-case text.")]

    def call(self, name, arguments):
        return ToolResult(True, str(arguments.get("text", "")).upper() + self.suffix)


def test_register_tool_with_default_kwargs() -> None:
    register_tool("upper_test", f"{__name__}:UpperTool", suffix="!")
    assert "upper_test" in TOOLS.names()
    assert make_tool("upper_test").call("upper", {"text": "hi"}).output == "HI!"
    assert make_tool("upper_test", suffix="?").call("upper", {"text": "a"}).output == "A?"
    with pytest.raises(ConfigError, match="cannot be built"):
        make_tool("upper_test", nope=1)
    with pytest.raises(ConfigError, match="unknown tool"):
        make_tool("no_such_tool")


def test_tool_by_import_path() -> None:
    # A YAML config names its own tool by import path: register_tool in the driver never reaches the env workers.
    tool = make_tool(f"{__name__}:UpperTool", suffix="?")
    assert tool.call("upper", {"text": "ab"}).output == "AB?"
    with pytest.raises(ConfigError, match="is not a roll.agentic.tools.Tool subclass"):
        make_tool("collections:OrderedDict")
    with pytest.raises(ConfigError, match=r"tool_id='tests_nowhere:Tool' cannot be imported"):
        make_tool("tests_nowhere:Tool")
    with pytest.raises(ConfigError, match=r"unknown tool 'pyhton_code'; known names: .*python_code.*import path"):
        make_tool("pyhton_code")


def test_check_tool_binds_tool_args_without_building() -> None:
    assert check_tool("python_code", {"timeout_s": 2.0, "tool_instruction": ""}).__name__ == "PythonCodeTool"
    with pytest.raises(
        ConfigError, match=r"tool 'python_code' cannot be built with tool_args \['timeot'\].*'timeout_s'"
    ):
        check_tool("python_code", {"timeot": 2})
