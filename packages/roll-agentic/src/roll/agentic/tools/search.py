"""``search``: look documents up with a pluggable backend; the built-in one is an offline BM25 index of a file.

Backends follow :class:`SearchBackend` (``search(query, top_k) -> list[SearchHit]``). ``backend="bm25"`` (the
default) reads ``corpus_path``: a ``.jsonl`` file of objects with ``text`` (or ``contents``), optional ``title``
and ``id``, or any other text file with one document per non-empty line. Any other ``backend`` value is an import
path (``"my_pkg.search:Engine"``) of a class built with ``backend_kwargs``.

``search_url`` (ROLL's key; GEM's ``SEARCH_URL`` variable when neither it nor a corpus is set; ``topk`` and
``timeout`` are read as ``top_k`` and ``timeout_s``) asks a retrieval server over HTTP instead (:class:`HttpSearchBackend`), in one of two
protocols (``protocol``):

* ``msgpack`` (the default, as ROLL's search tool, GEM's ``SearchTool``): GEM's retrieval server, the one ROLL's
  search examples start (``python -m gem.tools.search_engine.retrieval_server``): MessagePack ``{"query": q,
  "topk": k, "return_scores": true}`` -> ``{"result": [{"document": {"contents": ...}, "score": s}, ...]}``;
* ``json``: the Search-R1 retrieval server: JSON ``{"queries": [q], "topk": k, "return_scores": true}`` ->
  ``{"result": [[...]]}`` (one list per query).

Either way each document's ``contents`` is its title line, then its text (wiki-18).
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from roll.agentic.tools.base import Tool, ToolResult, ToolSpec
from roll.agentic.tools.msgpack_codec import pack, unpack
from roll.runtime import ConfigError, import_target

__all__ = ["PROTOCOLS", "BM25Index", "HttpSearchBackend", "SearchBackend", "SearchHit", "SearchTool", "load_documents"]

# Chinese and Japanese write no spaces between words: each Han or kana character is a token of its own (a run of them
# was one token, so a query matched only a document with the very same run); other scripts split into words.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_TOKEN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


@dataclass(frozen=True)
class SearchHit:
    doc_id: str
    title: str
    text: str
    score: float


@runtime_checkable
class SearchBackend(Protocol):
    def search(self, query: str, top_k: int) -> list[SearchHit]: ...


def load_documents(path: str | Path) -> list[dict[str, str]]:
    """Documents of a ``.jsonl`` or plain-text corpus file as ``{"id", "title", "text"}`` dicts."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"search corpus_path {str(path)!r} is not a file")
    docs: list[dict[str, str]] = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if path.suffix == ".jsonl":
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{path}:{line_no}: not a JSON object ({e.msg})") from None
                text = row.get("text", row.get("contents")) if isinstance(row, dict) else None
                if not isinstance(text, str):
                    raise ConfigError(f'{path}:{line_no}: needs a "text" (or "contents") string field')
                docs.append({"id": str(row.get("id", len(docs))), "title": str(row.get("title", "")), "text": text})
            else:
                docs.append({"id": str(len(docs)), "title": "", "text": line.strip()})
    if not docs:
        raise ConfigError(f"search corpus {str(path)!r} has no documents")
    return docs


class BM25Index:
    """Okapi BM25 (``k1``, ``b``) over lower-cased word tokens (single characters in Chinese and Japanese) of each
    document's title and text."""

    def __init__(self, documents: list[dict[str, str]], k1: float = 1.5, b: float = 0.75) -> None:
        self.documents, self.k1, self.b = documents, k1, b
        self.term_freqs = [Counter(_tokens(f"{d.get('title', '')} {d['text']}")) for d in documents]
        self.lengths = [sum(tf.values()) for tf in self.term_freqs]
        self.avg_length = sum(self.lengths) / max(1, len(self.lengths))
        doc_freq: Counter[str] = Counter()
        for tf in self.term_freqs:
            doc_freq.update(tf.keys())
        n = len(documents)
        self.idf = {term: math.log(1 + (n - df + 0.5) / (df + 0.5)) for term, df in doc_freq.items()}
        self.postings: dict[str, list[int]] = {}
        for i, tf in enumerate(self.term_freqs):
            for term in tf:
                self.postings.setdefault(term, []).append(i)

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: Any) -> BM25Index:
        return cls(load_documents(path), **kwargs)

    def search(self, query: str, top_k: int) -> list[SearchHit]:
        scores: dict[int, float] = {}
        for term in set(_tokens(query)):
            idf = self.idf.get(term)
            if idf is None:
                continue
            for i in self.postings[term]:
                tf = self.term_freqs[i][term]
                norm = tf + self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avg_length)
                scores[i] = scores.get(i, 0.0) + idf * tf * (self.k1 + 1) / norm
        best = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:top_k]
        return [
            SearchHit(self.documents[i]["id"], self.documents[i].get("title", ""), self.documents[i]["text"], score)
            for i, score in best
        ]


PROTOCOLS = ("msgpack", "json")
_OTHER_HINT = {
    "msgpack": "if it is a Search-R1 server (JSON), set tool_args.protocol: json",
    "json": "if it is GEM's retrieval server (MessagePack), set tool_args.protocol: msgpack",
}


class HttpSearchBackend:
    """A retrieval server at ``url`` speaking ``protocol`` (see the module docstring); an answer with one list per
    query (``{"result": [[...]]}``) or one query's list (``{"result": [...]}``) is read either way. Failures raise
    OSError or ValueError (naming the other protocol where the server refused or garbled this one)."""

    def __init__(self, url: str, timeout_s: float = 5.0, protocol: str = "msgpack") -> None:
        if protocol not in PROTOCOLS:
            raise ConfigError(f"search tool_args.protocol={protocol!r}: use one of {list(PROTOCOLS)}")
        self.url, self.timeout_s, self.protocol = url, timeout_s, protocol

    def search(self, query: str, top_k: int) -> list[SearchHit]:
        if self.protocol == "msgpack":
            body, kind = pack({"query": query, "topk": top_k, "return_scores": True}), "application/msgpack"
        else:
            body = json.dumps({"queries": [query], "topk": top_k, "return_scores": True}).encode()
            kind = "application/json"
        request = urllib.request.Request(self.url, body, {"Content-Type": kind}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as e:
            if 400 <= e.code < 500:
                raise ValueError(
                    f"the retrieval server refused the request (HTTP {e.code}); {_OTHER_HINT[self.protocol]}"
                ) from None
            raise
        try:
            answer = unpack(raw) if self.protocol == "msgpack" else json.loads(raw)
        except ValueError as e:  # MsgpackError and JSONDecodeError are ValueErrors
            raise ValueError(
                f"the retrieval server's answer is not {self.protocol} ({e}); {_OTHER_HINT[self.protocol]}"
            ) from None
        result = answer.get("result") if isinstance(answer, dict) else None
        if not isinstance(result, list):
            raise ValueError(f"the retrieval server's answer has no 'result' list: {str(answer)[:120]}")
        items = result[0] if result and isinstance(result[0], list) else result
        return [_hit(item, rank) for rank, item in enumerate(items[:top_k])]


def _hit(item: Any, rank: int) -> SearchHit:
    document = item.get("document", item) if isinstance(item, dict) else None
    if not isinstance(document, dict):
        raise ValueError(f"a retrieval result is not a document: {str(item)[:120]}")
    contents = str(document.get("contents", document.get("text", "")))
    title, _, text = contents.partition("\n")  # the corpus stores '"Title"\ntext' (wiki-18)
    if not text:
        title, text = "", contents
    title = str(document.get("title", title)).strip().strip('"')
    return SearchHit(str(document.get("id", rank)), title, text.strip(), float(item.get("score", 0.0)))


class SearchTool(Tool):
    """One function, ``search(query)``, returning the ``top_k`` best passages (under ``tool_format: gem`` listed as
    GEM's search tool lists them, ``Doc 1(Title: ...) text``), each cut to ``max_chars_per_hit`` characters with
    `` ...(truncated)`` where it was longer."""

    gem_form = "search"

    @staticmethod
    def check_args(search_url: str | None = None, **_: Any) -> None:
        """``roll validate``: a ``search_url`` answers (any HTTP answer counts)."""
        if search_url is None:
            return
        from roll.pipelines.validate import ping_service

        what = f"the search tool's search_url {search_url}"
        ping_service(search_url, what, "start the retrieval server or fix search_url")

    def __init__(
        self,
        corpus_path: str | None = None,
        backend: str = "bm25",
        backend_kwargs: dict[str, Any] | None = None,
        top_k: int = 3,
        max_chars_per_hit: int = 500,
        name: str = "search",
        search_url: str | None = None,
        timeout_s: float = 5.0,
        protocol: str = "msgpack",
        topk: int | None = None,
        timeout: float | None = None,
        num_workers: int | None = None,
    ) -> None:
        # ROLL's search tool is GEM's SearchTool: its spellings, and its SEARCH_URL fallback. num_workers sizes GEM's
        # thread pool; roll's tool calls run on the env's own worker, so it has no use here.
        del num_workers
        top_k = top_k if topk is None else topk
        timeout_s = timeout_s if timeout is None else timeout
        if search_url is None and corpus_path is None and backend == "bm25" and os.environ.get("SEARCH_URL"):
            search_url = os.environ["SEARCH_URL"]
        if top_k < 1:
            raise ConfigError(f"search top_k={top_k} must be >= 1")
        self.name, self.top_k, self.max_chars_per_hit = name, top_k, max_chars_per_hit
        if search_url is None and protocol != "msgpack":
            raise ConfigError(f"search tool_args.protocol={protocol!r}: the protocol applies to search_url only")
        if search_url is not None:
            if corpus_path is not None or backend != "bm25":
                raise ConfigError("the search tool takes search_url or corpus_path/backend, not both")
            self.backend: SearchBackend = HttpSearchBackend(search_url, timeout_s, protocol)
        elif backend == "bm25":
            if corpus_path is None:
                raise ConfigError("the search tool's bm25 backend needs corpus_path (a .jsonl or text file)")
            self.backend = BM25Index.from_file(corpus_path, **(backend_kwargs or {}))
        else:
            self.backend = import_target(backend, "search tool_args.backend")(**(backend_kwargs or {}))
            if not isinstance(self.backend, SearchBackend):
                raise ConfigError(f"search backend {backend!r} has no search(query, top_k) method")

    def specs(self) -> list[ToolSpec]:
        parameters = {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "What to look for."}},
            "required": ["query"],
        }
        return [ToolSpec(self.name, "Search the document collection and return the best passages.", parameters)]

    def _clip(self, text: str) -> str:
        """``text`` cut to ``max_chars_per_hit``, saying so: a passage cut mid-sentence read as the whole passage."""
        if len(text) <= self.max_chars_per_hit:
            return text
        return text[: self.max_chars_per_hit] + " ...(truncated)"

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            return ToolResult(False, 'search needs a non-empty "query" string argument')
        try:
            hits = self.backend.search(query, self.top_k)
        # a server that is down, drops the answer midway (http.client's IncompleteRead) or answers garbage: a failed
        # call, not a crash of the episode
        except (OSError, ValueError, http.client.HTTPException) as e:
            return ToolResult(False, f"search failed: {type(e).__name__}: {e}")
        if not hits:
            return ToolResult(True, "No results.")
        clipped = [(rank, hit, self._clip(hit.text)) for rank, hit in enumerate(hits, start=1)]
        if self.action_format == "gem":  # GEM's wording: one line per passage, each ending in a newline
            return ToolResult(True, "".join(f"Doc {rank}(Title: {hit.title}) {text}\n" for rank, hit, text in clipped))
        lines = [f"[{rank}] {hit.title}: {text}" if hit.title else f"[{rank}] {text}" for rank, hit, text in clipped]
        return ToolResult(True, "\n".join(lines))
