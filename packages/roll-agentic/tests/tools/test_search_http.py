"""The search tool's search_url: a retrieval server over HTTP, in GEM's MessagePack protocol (the default, the server
ROLL's search examples start) or Search-R1's JSON one, here a tiny local server speaking either."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from roll.agentic.tools import check_tool, make_tool
from roll.agentic.tools.msgpack_codec import pack, unpack
from roll.pipelines.validate import ServiceUnreachableError
from roll.runtime import ConfigError

CORPUS = ['"Paris"\nParis is the capital of France.', '"Lyon"\nLyon is a city in France.', '"Rome"\nRome is in Italy.']


class _Retrieval(BaseHTTPRequestHandler):
    """GEM's server (MessagePack in and out, one query, a flat list of hits) when the request is not JSON, else
    Search-R1's (JSON, a list of queries, one list of hits per query)."""

    requests: list[dict] = []

    def do_POST(self) -> None:  # http.server calls it by this name
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        gem = self.headers["Content-Type"] != "application/json"
        try:
            request = unpack(raw) if gem else json.loads(raw)
        except ValueError:
            self.send_response(422)  # what a typed server answers a body it cannot decode
            self.end_headers()
            return
        _Retrieval.requests.append(request)
        words = set((request["query"] if gem else request["queries"][0]).lower().split())
        ranked = sorted(CORPUS, key=lambda doc: -len(words & set(doc.lower().replace(".", "").split())))
        hits = [
            {"document": {"id": str(CORPUS.index(d)), "contents": d}, "score": 1.0 / (i + 1)}
            for i, d in enumerate(ranked)
        ][: request["topk"]]
        body = pack({"result": hits}) if gem else json.dumps({"result": [hits]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/msgpack" if gem else "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server_url() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Retrieval)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    server.shutdown()
    server.server_close()


EXPECTED = ["[1] Paris: Paris is the capital of France.", "[2] Lyon: Lyon is a city in France."]


def test_search_url_asks_gems_retrieval_server_in_msgpack_by_default(server_url: str) -> None:
    _Retrieval.requests.clear()
    tool = make_tool("search", search_url=server_url, top_k=2)
    result = tool.call("search", {"query": "capital of France"})
    assert result.ok and result.output.splitlines() == EXPECTED
    assert _Retrieval.requests == [{"query": "capital of France", "topk": 2, "return_scores": True}]
    assert check_tool("search", {"search_url": server_url}).__name__ == "SearchTool"


def test_protocol_json_asks_a_search_r1_server(server_url: str) -> None:
    _Retrieval.requests.clear()
    tool = make_tool("search", search_url=server_url, top_k=2, protocol="json")
    result = tool.call("search", {"query": "capital of France"})
    assert result.ok and result.output.splitlines() == EXPECTED
    assert _Retrieval.requests == [{"queries": ["capital of France"], "topk": 2, "return_scores": True}]


def test_the_wrong_protocol_fails_the_call_naming_the_other() -> None:
    class _JsonOnly(_Retrieval):  # a Search-R1 server: it reads every body as JSON
        def do_POST(self) -> None:
            self.headers.replace_header("Content-Type", "application/json")
            super().do_POST()

    server = HTTPServer(("127.0.0.1", 0), _JsonOnly)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    try:
        result = make_tool("search", search_url=url).call("search", {"query": "Paris"})
        with pytest.raises(ConfigError, match=r"protocol='grpc': use one of \['msgpack', 'json'\]"):
            make_tool("search", search_url=url, protocol="grpc")
    finally:
        server.shutdown()
        server.server_close()
    assert not result.ok
    assert result.output == (
        "search failed: ValueError: the retrieval server refused the request (HTTP 422); if it is a Search-R1 "
        "server (JSON), set tool_args.protocol: json"
    )
    with pytest.raises(ConfigError, match="the protocol applies to search_url only"):
        make_tool("search", corpus_path="docs.jsonl", protocol="json")


def test_a_server_that_goes_down_fails_the_call_and_one_never_up_warns_in_validate() -> None:
    server = HTTPServer(("127.0.0.1", 0), _Retrieval)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    tool = make_tool("search", search_url=url, timeout_s=1)
    with pytest.raises(ConfigError, match="not both"):
        make_tool("search", search_url=url, corpus_path="docs.jsonl")
    server.shutdown()
    server.server_close()
    result = tool.call("search", {"query": "anything"})
    assert not result.ok and result.output.startswith("search failed: URLError")
    with pytest.raises(ServiceUnreachableError, match=f"search_url {url} does not answer"):
        check_tool("search", {"search_url": url})


def test_an_answer_cut_off_midway_fails_the_call() -> None:
    class _Dropping(_Retrieval):  # announces a body, sends part of it and closes: http.client's IncompleteRead
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"\x81")

    server = HTTPServer(("127.0.0.1", 0), _Dropping)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = make_tool("search", search_url=f"http://127.0.0.1:{server.server_address[1]}/r").call(
            "search", {"query": "Paris"}
        )
    finally:
        server.shutdown()
        server.server_close()
    assert not result.ok and result.output.startswith("search failed: IncompleteRead")


def test_python_code_takes_rolls_tool_args() -> None:
    tool = make_tool("python_code", timeout=3, sandbox_type="none", keep_error_last_line=False)
    assert tool.timeout_s == 3
    failed = tool.call("python_code", {"code": "print('so far')\n1/0"})
    assert not failed.ok and failed.output.startswith("so far\nTraceback") and "ZeroDivisionError" in failed.output
    with pytest.raises(ConfigError, match="sandbox_type='docker'"):
        make_tool("python_code", sandbox_type="docker")


def test_gems_spellings_and_search_url_variable(server_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """ROLL's search tool is GEM's SearchTool: ``topk``, ``timeout``, ``num_workers`` and the ``SEARCH_URL``
    fallback."""
    tool = make_tool("search", search_url=server_url, topk=1, timeout=2, num_workers=4)
    assert tool.top_k == 1 and tool.backend.timeout_s == 2
    assert tool.call("search", {"query": "capital of France"}).output == EXPECTED[0]
    monkeypatch.setenv("SEARCH_URL", server_url)
    assert make_tool("search").call("search", {"query": "Lyon city"}).output.startswith("[1] Lyon: ")
    with pytest.raises(ConfigError, match="not both"):  # a corpus given with search_url set is still refused
        make_tool("search", search_url=server_url, corpus_path="docs.jsonl")
