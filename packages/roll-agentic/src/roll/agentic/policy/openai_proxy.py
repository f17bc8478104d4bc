"""A PolicyClient that sends each turn to an OpenAI-compatible endpoint (``llm_proxy.proxy_type: openai``).

``api: completions`` (roll's default) posts to ``/v1/completions``: the prompt is exactly the tokens roll rendered
for the turn, so the server continues the same conversation roll lays out. ``api: chat`` (the default of a
translated ROLL file, as ROLL's proxy only talks chat) posts the turn's chat messages to ``/v1/chat/completions``,
for hosted chat-only models: the server renders them with its own template, so its prompt may differ from the
sample's prompt tokens; the answer's text is tokenized with the run's tokenizer (the end of turn added when the model
stopped: the chat template's end-of-turn token, else EOS), so the sample layout stays roll's; a system message goes
folded into the first user message where the run's template refuses the system role (Gemma 2's), as the sample's
prompt was rendered. ``enable_thinking`` (true/false) goes as ``chat_template_kwargs``, as ROLL sends it; unset,
nothing is sent; set, it must equal the tags' ``enable_thinking``, which roll renders the samples' prompts with
(checked at load). Chat and tools
(:mod:`roll.agentic.policy.chat_messages`): the env's tools (``GenerateRequest.tools``) go as ``tools``; an answer's
structured ``tool_calls`` are written after its content in the env's own tool-call format, the text the env reads and
the sample holds; the history's calls go back as ``tool_calls`` answered by ``tool`` messages where they fit
OpenAI's rules, else as text. ``native_tools: false`` sends no ``tools`` and the history as text (an endpoint that
refuses ``tools``).

With ``token_ids: true`` (the default with ``api: completions``, for a server that serves the run's tokenizer: vLLM,
which answers ``return_token_ids``) the answer's ``token_ids`` are the turn's response, as the server sampled them: EOS
or a stop token kept, the tokens that completed a stop string kept, as roll's own engines return them; completions
send the prompt as its token ids too. ``api: chat`` takes them only when ``token_ids: true`` is set (a hosted chat
API refuses ``return_token_ids``): vLLM's chat answers carry the sampled ids, so a tool call is the model's own text
of it (spacing, text after the call) and an answer cut by ``max_tokens`` stays cut, where vLLM's ``finish_reason``
says ``tool_calls`` and the call rewritten in the env's format would end with EOS; the structured ``tool_calls``
still make the history. Re-tokenizing the answer's text does not give those tokens back (a byte-level token that is half a
UTF-8 character decodes to U+FFFD), so text is only the fallback: ``token_ids: false`` sends the prompt as text
(decoded with special tokens kept) and tokenizes the answer with the run's tokenizer, for a hosted model that rejects
``return_token_ids``; a stop string the server cut is put back when it says which (``stop_reason``, as vLLM and SGLang
do), and a stopped answer is ended with the template's end-of-turn token (EOS where the template has none apart).

Sampling comes from the manager's generation config (``max_new_tokens``, ``temperature``, ``top_p``, ``stop_strings``)
and the request's ``seed`` (the turn's sampling seed, sent as the API's ``seed``: vLLM then samples the turn as roll's
in-process vLLM engine does with the same seed); ``max_new_tokens`` goes as ``max_tokens``, or under ``api: chat`` as
``max_completion_tokens`` once the endpoint refuses ``max_tokens`` asking for it (OpenAI's reasoning models). Transient
failures (HTTP 408/429/5xx, timeouts, refused connections, answers cut off) are retried ``max_retries`` times with
doubling waits, then the turn comes back ``abort``: the episode ends ``aborted``, counted by the scheduler like a
dropped request. Any other HTTP error, or an answer that is not JSON, is a ConfigError naming the env tag and the fix.
Log-probs are not asked for (the samples are not the trained policy's).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
import urllib.error
import urllib.request
from typing import Any

from roll.agentic.policy.chat_messages import answer_calls, answer_text, openai_messages
from roll.agentic.policy.protocol import GenerateRequest, GenerateResult
from roll.pipelines.data.templates import for_template
from roll.runtime import ConfigError

__all__ = ["OpenAIProxyClient"]

logger = logging.getLogger(__name__)

_TRANSIENT = {408, 429, 500, 502, 503, 504}
APIS = ("completions", "chat")


class OpenAIProxyClient:
    """Answers each request with an OpenAI-compatible server's completion of the rendered prompt."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        base_url: str,
        model_name: str,
        api_key: str | None = None,
        api_key_env: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        retry_delay: float = 2.0,
        token_ids: bool | None = None,
        api: str = "completions",
        enable_thinking: bool | None = None,
        native_tools: bool = True,
    ) -> None:
        """``proxy_config``'s keys (ROLL's names): ``api_key``, or ``api_key_env`` naming an environment variable
        that holds it; ``timeout`` seconds per request; ``retry_delay`` seconds before the first retry (doubling);
        roll's ``token_ids``: read the answer's token ids, and with completions send the prompt's (false: text both
        ways; default: true with completions, false with chat); roll's
        ``api``: ``completions`` (rendered prompt) or ``chat`` (messages); ``enable_thinking``: chat only; roll's
        ``native_tools`` (chat): offer the env's tools as ``tools`` and keep tool calls structured in the history
        (false: no ``tools``, calls and results as text, for an endpoint that refuses ``tools``)."""
        if api not in APIS:
            raise ConfigError(f"llm_proxy.proxy_config.api {api!r} is not one of {list(APIS)}")
        if not isinstance(native_tools, bool):
            raise ConfigError(f"llm_proxy.proxy_config.native_tools {native_tools!r} must be true or false")
        if token_ids is not None and not isinstance(token_ids, bool):
            raise ConfigError(f"llm_proxy.proxy_config.token_ids {token_ids!r} must be true, false or null")
        if enable_thinking is not None and not isinstance(enable_thinking, bool):
            raise ConfigError(f"llm_proxy.proxy_config.enable_thinking {enable_thinking!r} must be true, false or null")
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"llm_proxy.proxy_config.base_url {base_url!r} must start with http:// or https://")
        if api_key_env and not api_key:
            api_key = os.environ.get(api_key_env)
            if not api_key:
                raise ConfigError(
                    f"llm_proxy.proxy_config.api_key_env {api_key_env!r} is not set in the environment; export it "
                    "(on every env worker's machine) or give api_key"
                )
        self.tokenizer, self.model, self.api_key = tokenizer, model_name, api_key
        root = base_url.rstrip("/")
        path = "/chat/completions" if api == "chat" else "/completions"
        self.url = root + (path if root.endswith("/v1") else "/v1" + path)
        self.timeout_s, self.max_retries, self.backoff_s = timeout, max_retries, retry_delay
        self.api, self.enable_thinking, self.native_tools = api, enable_thinking, native_tools
        self.token_ids = api == "completions" if token_ids is None else token_ids
        from roll.agentic.env_manager.chat import turn_end_token_id  # the env managers import this package

        self.eos_token_id = int(tokenizer.eos_token_id)
        # text mode: a stopped answer ends with the template's end of turn, as the model wrote it (Gemma's
        # <end_of_turn>, not <eos>: an EOS inside the history would reach the server with the next prompts)
        self.turn_end_id = turn_end_token_id(tokenizer)
        # OpenAI's reasoning models refuse chat's max_tokens and take max_completion_tokens, which other servers may
        # not know: max_tokens until an endpoint refuses it by that name
        self.budget_key = "max_tokens"

    @property
    def wants_messages(self) -> bool:
        """Env managers put the turn's chat messages in each request (``GenerateRequest.messages``)."""
        return self.api == "chat"

    def body(self, request: GenerateRequest) -> dict[str, Any]:
        """The JSON sent for ``request``."""
        config = request.generation_config
        body: dict[str, Any] = {"model": self.model}
        if self.api == "chat":
            if not request.messages:
                raise ConfigError(
                    f"env tag {request.meta.get('tag', '?')!r}: llm_proxy api chat needs the turn's messages, but "
                    "the env manager gave none (its build_prompt must fill state.messages); use api: completions"
                )
            # a template refusing the system role (Gemma 2's) rendered the sample with the system text folded into the
            # first user message: the server gets the conversation the sample holds, not one its template refuses
            messages = for_template(self.tokenizer, request.messages)
            body["messages"] = openai_messages(messages, request.tools, self.native_tools)
            if self.native_tools and request.tools is not None and request.tools.schemas:
                body["tools"] = list(request.tools.schemas)
        elif self.token_ids:
            body["prompt"] = list(request.prompt_ids)
        else:
            body["prompt"] = self.tokenizer.decode(request.prompt_ids, skip_special_tokens=False)
        body |= {
            self.budget_key: config.max_new_tokens,
            "temperature": config.temperature,
            "top_p": config.top_p,
        }
        if config.stop_strings:
            body["stop"] = list(config.stop_strings)
        if request.seed is not None:
            body["seed"] = request.seed
        if self.token_ids:
            body["return_token_ids"] = True
        if self.api == "chat" and self.enable_thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": self.enable_thinking}
        return body

    def _post(self, body: dict[str, Any]) -> bytes:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, json.dumps(body).encode(), headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as response:
            return bytes(response.read())

    def _hint(self, code: int, body: dict[str, Any], detail: str) -> str:
        """What to change in proxy_config for an HTTP error other than a transient one."""
        if self.api == "completions" and code in (404, 405):
            return "; a chat-only endpoint needs proxy_config.api: chat"
        if self.api == "chat" and code == 400:
            hints = []
            if "chat template" in detail.lower():  # vLLM: "... you must provide a chat template if the tokenizer ..."
                hints.append(
                    "the served model has no chat template: serve one (vllm serve --chat-template) or render the "
                    "prompts with roll, proxy_config.api: completions"
                )
            if "system" in detail.lower() and body["messages"][0].get("role") == "system":
                hints.append(
                    "the served model's template refuses the system role: run with that model's tokenizer "
                    "(model_name_or_path), whose template roll probes and then folds the system prompt into the "
                    "first user message"
                )
            if self.enable_thinking is not None:
                hints.append("an endpoint that takes no chat_template_kwargs needs proxy_config.enable_thinking: null")
            if "tools" in body:
                hints.append(
                    "one that refuses tools (vLLM without --enable-auto-tool-choice) needs proxy_config.native_tools: "
                    "false"
                )
            if self.token_ids:
                hints.append("one that takes no return_token_ids needs proxy_config.token_ids: false")
            return "".join(f"; {hint}" for hint in hints)
        return "; a server that takes no token ids needs proxy_config.token_ids: false" if self.token_ids else ""

    def _budget_key_refused(self, code: int, detail: str) -> bool:
        """Whether a chat endpoint refused ``max_tokens`` asking for ``max_completion_tokens`` (OpenAI's o-series and
        gpt-5 models); the key is switched for every later request."""
        if (
            self.api != "chat"
            or code != 400
            or self.budget_key != "max_tokens"
            or "max_completion_tokens" not in detail
        ):
            return False
        logger.info("%s refused max_tokens: the turns' budget goes as max_completion_tokens", self.url)
        self.budget_key = "max_completion_tokens"
        return True

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        tag = request.meta.get("tag", "?")
        body = self.body(request)
        for attempt in range(self.max_retries + 1):
            try:
                raw = await asyncio.to_thread(self._post, body)
                break
            except urllib.error.HTTPError as e:
                if e.code not in _TRANSIENT:
                    detail = e.read().decode(errors="replace")[:300]
                    if self._budget_key_refused(e.code, detail):
                        return await self.generate(request)  # once: the key is max_completion_tokens from now on
                    hint = self._hint(e.code, body, detail)
                    raise ConfigError(
                        f"env tag {tag!r}: llm_proxy openai endpoint {self.url} answered HTTP {e.code}: {detail}; "
                        f"check proxy_config (base_url, model, api_key){hint}"
                    ) from None
                error = f"HTTP {e.code}"
            # a body cut short (IncompleteRead) or a garbled status line is a dropped connection: retried too
            except (TimeoutError, urllib.error.URLError, ConnectionError, http.client.HTTPException) as e:
                error = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            if attempt < self.max_retries:
                await asyncio.sleep(self.backoff_s * 2**attempt)
        else:
            logger.warning(
                "env tag %r: %s failed %d times (%s); the episode ends aborted", tag, self.url, attempt + 1, error
            )
            return GenerateResult(request.request_id, [], None, "abort")
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise ConfigError(
                f"env tag {tag!r}: {self.url} answered HTTP 200 with a body that is not a JSON object "
                f"({raw[:200].decode(errors='replace')!r}); base_url must be an OpenAI-compatible endpoint (its /v1 "
                "root, e.g. http://host:8000/v1) that answers without streaming"
            )
        field = "message.content" if self.api == "chat" else "text"
        calls: list[dict[str, Any]] = []
        try:
            choice = answer["choices"][0]
            text = str(choice["message"]["content"] or "") if self.api == "chat" else str(choice["text"])
            finish = choice.get("finish_reason")
            if self.api == "chat":
                calls = answer_calls(choice["message"], f"env tag {tag!r}: {self.url}")
        except (KeyError, IndexError, TypeError):
            raise ConfigError(
                f"env tag {tag!r}: {self.url} answered without choices[0].{field} ({str(answer)[:200]}); base_url "
                f"must be an OpenAI-compatible endpoint that serves api: {self.api}"
            ) from None
        if self.token_ids:
            return self._sampled(request, choice, request.generation_config.max_new_tokens, calls, text)
        budget = request.generation_config.max_new_tokens
        if calls:  # the env reads calls from the text: they are written in its format, the sample is that text
            content, text = text, answer_text(text, calls, request.tools)
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            # cut by max_tokens (the last call's arguments unfinished), or the written calls outgrow the turn's budget:
            # a cut answer, without EOS, its calls not kept as structured ones for the history
            if finish == "length" or len(ids) >= budget:
                return GenerateResult(request.request_id, ids[:budget], None, "length")
            return GenerateResult(
                request.request_id, [*ids, self.turn_end_id], None, "stop", tool_calls=calls, content=content
            )
        stop = choice.get("stop_reason")  # vLLM/SGLang: the stop string matched, which the text leaves out
        if isinstance(stop, str) and stop in request.generation_config.stop_strings:
            text += stop
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if finish == "length":
            return GenerateResult(request.request_id, ids[:budget], None, "length")
        return GenerateResult(request.request_id, [*ids, self.turn_end_id], None, "stop")

    def _sampled(
        self, request: GenerateRequest, choice: dict[str, Any], budget: int, calls: list[dict[str, Any]], content: str
    ) -> GenerateResult:
        """The answer's ``token_ids`` as the turn's response (``calls`` and their ``content`` kept for the history)."""
        sampled = choice.get("token_ids")
        if not isinstance(sampled, list):
            raise ConfigError(
                f"env tag {request.meta.get('tag', '?')!r}: {self.url} answered without choices[0].token_ids: the "
                "server does not honour return_token_ids (vLLM does); set llm_proxy.proxy_config.token_ids: false to "
                "send and read text"
            )
        sampled = [int(i) for i in sampled]  # as sampled: EOS or a stop token kept, no EOS after a stop string
        # vLLM says "tool_calls" for an answer with calls however it ended: cut by the budget, it stopped on nothing
        ends = (self.eos_token_id, self.turn_end_id)  # vLLM stops on a generation config's end tokens as on EOS
        stopped = choice.get("stop_reason") is not None or (bool(sampled) and sampled[-1] in ends)
        cut = choice.get("finish_reason") == "length" or (len(sampled) >= budget and not stopped)
        # a finish other than the budget (vLLM's "abort", "repetition") ended the answer too, as in roll's engines
        return GenerateResult(
            request.request_id,
            sampled,
            None,
            "length" if cut else "stop",
            tool_calls=calls or None,
            content=content if calls else "",
        )
