"""The search tool's search_url: a retrieval server over HTTP (Search-R1's JSON protocol), here a tiny local one."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from roll.agentic.tools import check_tool, make_tool
from roll.pipelines.validate import ServiceUnreachableError
from roll.runtime import ConfigError

CORPUS = ['"Paris"\nParis is the capital of France.', '"Lyon"\nLyon is a city in France.', '"Rome"\nRome is in Italy.']


class _Retrieval(BaseHTTPRequestHandler):
    requests: list[dict] = []

    def do_POST(self) -> None:  # http.server calls it by this name
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Retrieval.requests.append(request)
        words = set(request["queries"][0].lower().split())
        ranked = sorted(CORPUS, key=lambda doc: -len(words & set(doc.lower().replace(".", "").split())))
        hits = [
            {"document": {"id": str(CORPUS.index(d)), "contents": d}, "score": 1.0 / (i + 1)}
            for i, d in enumerate(ranked)
        ]
        body = json.dumps({"result": [hits[: request["topk"]]]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
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


def test_search_url_asks_the_retrieval_server(server_url: str) -> None:
    _Retrieval.requests.clear()
    tool = make_tool("search", search_url=server_url, top_k=2)
    result = tool.call("search", {"query": "capital of France"})
    assert result.ok
    assert result.output.splitlines() == [
        "[1] Paris: Paris is the capital of France.",
        "[2] Lyon: Lyon is a city in France.",
    ]
    assert _Retrieval.requests == [{"queries": ["capital of France"], "topk": 2, "return_scores": True}]
    assert check_tool("search", {"search_url": server_url}).__name__ == "SearchTool"


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


def test_python_code_takes_rolls_tool_args() -> None:
    tool = make_tool("python_code", timeout=3, sandbox_type="none", keep_error_last_line=False)
    assert tool.timeout_s == 3
    failed = tool.call("python_code", {"code": "print('so far')\n1/0"})
    assert not failed.ok and failed.output.startswith("so far\nTraceback") and "ZeroDivisionError" in failed.output
    with pytest.raises(ConfigError, match="sandbox_type='docker'"):
        make_tool("python_code", sandbox_type="docker")
