"""Hub model ids: resolved from a pre-populated local HF cache in offline mode (there is no network here), with
``revision``; a missing one is one error naming the id and the cache; ModelScope when USE_MODELSCOPE is set."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import transformers

from roll.pipelines.assets import resolve_assets
from roll.pipelines.config import load_config
from roll.pipelines.hub import HubError, is_hub_id, resolve_hub_repo
from roll.runtime import ConfigError, MissingExtraError
from roll.strategies.testing import make_tiny_causal_lm

REPO = "roll-test/tiny-qwen"


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two different tiny models (seed 0 and seed 1) as local HF folders."""
    root = tmp_path_factory.mktemp("tiny")
    return make_tiny_causal_lm(root / "a", preset="nano", seed=0), make_tiny_causal_lm(
        root / "b", preset="nano", seed=1
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Qwen/Qwen2.5-0.5B-Instruct", True),
        ("org/name.v2_x-y", True),
        ("gpt2", False),  # a bare name is read as a (missing) local path, never sent to a hub
        ("./org/name", False),
        ("/abs/path", False),
        ("a/b/c", False),
        ("org/../x", False),
        ("tiny://nano", False),
    ],
)
def test_hub_id_shape(value, expected):
    assert is_hub_id(value) is expected


def test_hub_id_resolves_from_the_offline_cache_by_revision(hub_cache, tiny_models):
    a, b = tiny_models
    main = hub_cache(REPO, a)
    v2 = hub_cache(REPO, b, ref="v2")
    assert resolve_hub_repo(REPO) == main
    assert resolve_hub_repo(REPO, revision="v2") == v2
    assert resolve_hub_repo(REPO, revision=main.name) == main  # a commit hash
    # What is resolved is the model itself: the two revisions hold different weights.
    config = transformers.AutoConfig.from_pretrained(resolve_hub_repo(REPO, revision="v2"))
    assert config.model_type == "qwen2"
    assert (v2 / "model.safetensors").read_bytes() != (main / "model.safetensors").read_bytes()


def test_missing_hub_id_offline_is_one_error_naming_id_and_cache(hub_cache):
    with pytest.raises(HubError) as info:
        resolve_hub_repo("roll-test/not-downloaded", revision="v1")
    message = str(info.value)
    assert "'roll-test/not-downloaded'" in message
    assert "revision 'v1'" in message
    assert str(hub_cache.cache) in message
    assert "HF_HUB_OFFLINE" in message
    assert "hf download roll-test/not-downloaded --revision v1" in message


def test_config_with_a_hub_id_resolves_to_the_cached_snapshot(hub_cache, tiny_models, tmp_path):
    snapshot = hub_cache(REPO, tiny_models[1], ref="v2")
    config = load_config(
        "rlvr-rollout-tiny",
        [f"actor_infer.model_args.model_name_or_path={REPO}", "actor_infer.model_args.revision=v2"],
    )
    resolved = resolve_assets(config)
    assert resolved.actor_infer.model_args.model_name_or_path == str(snapshot)
    assert config.actor_infer.model_args.model_name_or_path == REPO  # the original config is unchanged


def test_config_with_a_missing_hub_id_names_the_field(hub_cache):
    config = load_config("rlvr-rollout-tiny", ["actor_infer.model_args.model_name_or_path=roll-test/absent"])
    with pytest.raises(ConfigError) as info:
        resolve_assets(config)
    message = str(info.value)
    assert message.startswith("actor_infer.model_args.model_name_or_path='roll-test/absent' is no local folder")
    assert str(hub_cache.cache) in message


def test_not_a_path_nor_a_hub_id(hub_cache):
    config = load_config("rlvr-rollout-tiny", ["actor_infer.model_args.model_name_or_path=no_such_folder"])
    with pytest.raises(ConfigError, match="'no_such_folder' does not exist and is not a hub id"):
        resolve_assets(config)


def test_modelscope_without_the_package_names_the_extra(hub_cache, monkeypatch):
    monkeypatch.setenv("USE_MODELSCOPE", "1")
    monkeypatch.setitem(sys.modules, "modelscope", None)  # import fails as if not installed
    with pytest.raises(MissingExtraError) as info:
        resolve_hub_repo(REPO)
    assert info.value.pip_command == "pip install 'roll-pipelines[modelscope]'"


def test_modelscope_is_used_when_use_modelscope_is_set(hub_cache, monkeypatch, tmp_path):
    calls = []

    def snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(tmp_path / "ms" / repo_id)

    monkeypatch.setenv("USE_MODELSCOPE", "true")
    monkeypatch.setitem(sys.modules, "modelscope", types.SimpleNamespace(snapshot_download=snapshot_download))
    assert resolve_hub_repo(REPO, revision="v1.0") == tmp_path / "ms" / REPO
    assert calls == [(REPO, {"revision": "v1.0"})]
