"""The mcp tool against a real stdio MCP server (a local script)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from roll.agentic.tools import make_tool
from roll.runtime import ConfigError

pytestmark = pytest.mark.extra("mcp")


@pytest.fixture(autouse=True)
def _needs_mcp() -> None:
    # Per test, not at import: a module skipped whole collects nothing, which Pants counts as a failure.
    pytest.importorskip("mcp")


SERVER = str(Path(__file__).with_name("mcp_calc_server.py"))


def test_mcp_tool_lists_and_calls_server_tools() -> None:
    tool = make_tool("mcp", command=sys.executable, args=[SERVER], timeout_s=60, startup_timeout_s=120)
    try:
        specs = {s.name: s for s in tool.specs()}
        assert set(specs) == {"add", "explode"}
        assert specs["add"].parameters["required"] == ["a", "b"] and specs["add"].description == "Add two integers."
        assert tool.call("add", {"a": 2, "b": 40}).output == "42" and tool.call("add", {"a": 2, "b": 40}).ok
        failed = tool.call("explode", {"message": "boom"})
        assert not failed.ok and "explode" in failed.output
        assert not tool.call("missing", {}).ok
    finally:
        tool.close()
    tool.close()  # twice is fine


def test_mcp_tool_filter_and_bad_server() -> None:
    tool = make_tool("mcp", command=sys.executable, args=[SERVER], tool_names=["add"], startup_timeout_s=120)
    try:
        assert [s.name for s in tool.specs()] == ["add"]
    finally:
        tool.close()
    with pytest.raises(ConfigError, match="did not start"):
        make_tool("mcp", command=sys.executable, args=["-c", "import sys; sys.exit(3)"], startup_timeout_s=60)


def test_a_server_that_never_answers_is_stopped_with_the_startup_error(tmp_path: Path) -> None:
    """The startup timeout's ConfigError leaves no server process behind (the session still starting used to keep
    it alive: nothing cancelled it)."""
    marker = tmp_path / "pid"
    silent = f"import os, pathlib, time; pathlib.Path({str(marker)!r}).write_text(str(os.getpid())); time.sleep(120)"
    with pytest.raises(ConfigError, match="did not start"):
        make_tool("mcp", command=sys.executable, args=["-c", silent], startup_timeout_s=2)
    pid = int(marker.read_text())
    deadline = time.monotonic() + 10
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(pid)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie waiting for its parent)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_roll_validate_finds_a_server_command_that_is_not_here() -> None:
    from roll.agentic.tools import check_tool
    from roll.pipelines.validate import NotHereError

    assert check_tool("mcp", {"command": sys.executable, "args": [SERVER]}).__name__ == "MCPTool"
    with pytest.raises(NotHereError, match=r"command '/nonexistent/mcp-server' is not a program on this machine"):
        check_tool("mcp", {"command": "/nonexistent/mcp-server"})
    # the entry's check keeps the type: `roll validate --no-ray` reports it as a warning (a fact of this machine)
    from roll.agentic.config import CustomEnvConfig
    from roll.agentic.pool import check_env_spec

    tools = {"tool_configs": [{"tool_id": "mcp", "tool_args": {"command": "/nonexistent/mcp-server"}}]}
    with pytest.raises(NotHereError, match=r"custom_envs\.Lake: the mcp tool's command"):
        check_env_spec("Lake", CustomEnvConfig(env_type="frozen_lake", tool_wrapper=tools))


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_mcp_tool_over_sse_at_server_url() -> None:
    """ROLL's ``server_url``: a running server spoken to over HTTP (SSE); validate warns while it does not answer."""
    import subprocess
    import urllib.request

    from roll.agentic.tools import check_tool
    from roll.pipelines.validate import ServiceUnreachableError

    port = _free_port()
    url = f"http://127.0.0.1:{port}/sse"
    with pytest.raises(ServiceUnreachableError, match=f"server_url '{url}' does not answer"):
        check_tool("mcp", {"server_url": url})
    with pytest.raises(ConfigError, match="command .* or server_url, one of them"):
        check_tool("mcp", {"server_url": url, "command": sys.executable})
    server = subprocess.Popen([sys.executable, SERVER, "sse", str(port)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=1).close()
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                time.sleep(0.2)
        check_tool("mcp", {"server_url": url})
        tool = make_tool("mcp", server_url=url, timeout_s=30, startup_timeout_s=60)
        try:
            assert {s.name for s in tool.specs()} == {"add", "explode"}
            assert tool.call("add", {"a": 20, "b": 22}).output == "42"
        finally:
            tool.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_server_url_transport_is_sse_unless_the_path_ends_in_mcp() -> None:
    from roll.agentic.tools.mcp import mcp_transport_of

    assert mcp_transport_of("http://host:8000/sse") == "sse"
    assert mcp_transport_of("https://host/sokoban/sse?token=1") == "sse"
    assert mcp_transport_of("http://host:8000/mcp") == "streamable_http"
    assert mcp_transport_of("http://host:8000/mcp/") == "streamable_http"
    assert mcp_transport_of("http://host:8000/mcp", "sse") == "sse"
    with pytest.raises(ConfigError, match=r"transport 'websocket' is not one of \['sse', 'streamable_http'\]"):
        mcp_transport_of("http://host:8000/mcp", "websocket")
