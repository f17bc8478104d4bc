"""Validation's generation settings: the response budget, greedy by default, and a fixed seed for sampling."""

from __future__ import annotations

from roll.pipelines.rlvr.config import RLVRConfig
from roll.pipelines.rlvr.rollout import step_generation_config
from roll.pipelines.rlvr.validation import validation_generation_config

ROLE = {"model_args": {"model_name_or_path": "tiny://nano"}, "strategy_args": {"strategy_name": "mock_infer"}}


def make_config(**overrides: object) -> RLVRConfig:
    return RLVRConfig.model_validate(
        {
            "pipeline_cls": "rlvr",
            "actor_train": {**ROLE, "data_args": {"file_name": "synthetic://arithmetic_prompts?n=8"}},
            "actor_infer": {**ROLE, "generating_args": {"num_return_sequences": 2}},
            "rewards": {"math": {"reward_type": "math"}},
            "rollout": {"response_length": 24},
            **overrides,
        }
    )


def test_sampled_validation_gets_one_seed_from_the_run_seed() -> None:
    sampled = {"generating_args": {"temperature": 0.6, "top_p": 0.6, "num_return_sequences": 1}}
    config = make_config(validation=sampled, seed=42)
    generation = validation_generation_config(config)
    assert generation.max_new_tokens == 24 and generation.temperature == 0.6
    # the same seed at every validation (before and after training sample under the same noise) ...
    assert generation.seed is not None and validation_generation_config(config).seed == generation.seed
    # ... that follows the run's seed and is none of the training steps' seeds
    assert validation_generation_config(make_config(validation=sampled, seed=7)).seed != generation.seed
    train = config.actor_infer.generating_args
    assert generation.seed not in {step_generation_config(train, 42, step).seed for step in range(100)}


def test_a_seed_the_file_gives_is_kept() -> None:
    seeded = {"generating_args": {"temperature": 0.6, "seed": 123}}
    assert validation_generation_config(make_config(validation=seeded)).seed == 123
    greedy = validation_generation_config(make_config())
    assert greedy.temperature == 0.0 and greedy.max_new_tokens == 24
