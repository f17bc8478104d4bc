"""Where a ROLL knob's semantics need a word: what ROLL's code does (file:function) and what roll does.

Data only; :mod:`roll.pipelines.compat.docs` renders it into ``docs/roll-compat.md``.
"""

from __future__ import annotations

__all__ = ["ROLL_ENVS_NOT_BUILT", "ROLL_ENV_TYPES", "SEMANTICS_NOTES"]

# (ROLL keys, what ROLL's code does, what roll does)
SEMANTICS_NOTES: list[tuple[str, str, str]] = [
    (
        "rl_loss_coef",
        "rlvr/actor_worker.py and actor_pg_worker.py `loss_func`: `(pg_loss + kl_loss_coef * kl_loss) * "
        "rl_loss_coef`, then `- entropy_loss_coef * entropy`.",
        "The same (`policy_loss.rl_loss_coef`).",
    ),
    (
        "postive_loss_coef, use_topr_neg_loss_coef",
        "Fields of RLVRConfig. Up to v0.1 (commit 46b75d6a to v0.2.0) ActorWorker `loss_func` added "
        "`postive_loss_coef * agg(-A * logp, score > 0 tokens)` and `use_topr_neg_loss_coef * "
        "agg(-clip(ratio, 0, 1) * A * logp, score <= 0 tokens)`, without sample weights (TOPR before `pg_variant`). "
        "v0.2.0 removed both terms: at ROLL HEAD the fields are read by nothing, so `rl_loss_coef: 0` as in "
        "`example_topr.yaml` leaves ROLL's actor with the entropy term only. The docs example's values `x_1`/`x_2` "
        "are placeholders, not numbers.",
        "Implemented as ROLL 0.1 defined them (`policy_loss.positive_loss_coef`, "
        "`policy_loss.topr_negative_loss_coef`), for every `pg_variant`; each term is normalized like the policy "
        "loss (the mini-batch's tokens or sequences; ROLL 0.1: the micro-batch's positive or negative tokens). A "
        "non-number (the example's `x_2`) is an error. `positive_loss_coef` (the docs' spelling) is not a ROLL field "
        "and is ignored, as ROLL drops it.",
    ),
    (
        "train_infer_correction.filters",
        "utils/train_infer_corrections.py `compute_train_infer_correction`: per filter, token / geometric / sequence "
        "/ segment ratio `exp(old - infer)` and diff `p_old - p_infer`, kept within [low, high]; filters multiply; "
        "the mask is applied to the loss masks after the advantages (pipeline with old log-prob recompute, else in "
        "the actor's loss with the training forward's log-probs).",
        "The same statistics and bounds (`correction.filters`), applied to the loss mask after the advantages; old "
        "log-probs are recomputed when a filter is on (`old_log_probs_recompute: auto`), which gives the values "
        "ROLL's actor-side path compares. Metrics: `actor/train_infer_*_mask_mean`, "
        "`actor/train_infer_masked_tokens`, `actor/train_infer_masked_sequences`.",
    ),
    (
        "kl_penalty: full",
        "utils/functionals.py `compute_approx_kl`: `F.kl_div(ref, logp, log_target=True).sum(-1) * action_mask`. "
        "Given per-token log-probs (B, T), as every caller passes, the sum runs over the sequence, giving (B,), and "
        "the product with the (B, T) mask fails (shape error; a wrong broadcast when B == T or B == 1); "
        "compute_token_reward calls it "
        "every step, so a ROLL RLVR run with `full` stops at its first step. Its help text intends the actual KL "
        "over the whole distribution. ROLL's KL loss ignores kl_penalty (always k3).",
        "The intended exact KL `sum_v p (log p - log q)` per token, from both models' whole log-softmax "
        "(the reference sends batch x length x vocab floats; the recompute pass too when the KL is in the reward). "
        "ROLL files keep ROLL's k3 KL loss (`kl.loss_penalty: k3`); `kl.loss_penalty: full` makes the loss exact too.",
    ),
    (
        "(per-domain statistics)",
        "pipeline/rlvr/rlvr_pipeline.py: the batch is grouped by `domain`; get_sample_level_mask, reward_postprocess "
        "(reward_norm batch/group/running, reward_clip), compute_token_reward and compute_advantage (whiten_rewards, "
        "whiten_advantages, advantage_clip) run on each domain's rows. The adaptive KL controller is updated after "
        "each domain, so later domains' rewards see a coefficient updated within the step.",
        "`advantage.domain_stats: true` (written in for ROLL files) computes each domain's targets on its own rows; "
        "the KL controller is updated once per step, with the batch's mean KL.",
    ),
    (
        "reward_clip",
        "RLVR: functionals.py `reward_postprocess` clamps after the normalization, and `compute_token_reward` clamps "
        "the token rewards again after the KL penalty. Agentic: agentic/utils.py `compute_response_level_rewards` "
        "clamps the normalized response-level rewards; `compute_token_reward` clamps the token rewards again.",
        "RLVR: the same order. Agentic: the normalized rewards (grpo, reinforce, gigpo, step_reinforce; their token "
        "rewards again once `add_token_level_kl` joined them) and the token rewards of gae and agentic_reinforce "
        "(roll's agentic GAE takes raw scores and agentic_reinforce per-turn rewards, where ROLL expands the "
        "normalized episode reward).",
    ),
    (
        "(agentic) add_token_level_kl, init_kl_coef, kl_penalty",
        "agentic_pipeline.py calls functionals.py `compute_token_reward`: the expanded response-level reward minus "
        "`init_kl_coef x KL(old || ref)` (estimator `kl_penalty`, default 'kl') on every response token; "
        "agentic_reinforce then reads each turn's last token only. The actor's KL loss is always k3.",
        "The same subtraction (`kl.in_reward`, `kl.init_coef`, `kl.penalty`) for every estimator; agentic_reinforce "
        "sums a turn's token rewards, so its return carries the KL of all the turn's tokens. ROLL files get "
        "`kl.loss_penalty: k3` and, unless given, `kl_penalty: kl`.",
    ),
    (
        "(agentic) adv_estimator gae, reinforce on multi-turn (trajectory-wise) rows",
        "functionals.py `compute_gae_advantage_return` / `compute_reinforce_return` step over every response "
        "position, the environment's tokens between turns included (value 0, reward 0), so each env token "
        "discounts by gamma (GAE: gamma x lambda) and a turn's last token bootstraps from value 0.",
        "Only assistant tokens are time steps: a turn's last token bootstraps from the next turn's first token, and "
        "env tokens discount nothing. Equal to ROLL's when gamma = lambda = 1; with lambda < 1 (ROLL's GAE default "
        "0.95) the advantages of multi-turn rows differ.",
    ),
    (
        "(agentic) adv_estimator grpo / reinforce on step-wise samples",
        "agentic/utils.py `compute_response_level_rewards`: a step-wise row's reward is its own `scores` summed (the "
        "turn's reward), normalized by `reward_normalization`.",
        "The row's episode score (`episode_scores`), normalized by `reward_normalization`: every turn of an episode "
        "gets the episode's outcome. For turn rewards use `step_reinforce` (discounted step returns) or `gigpo`.",
    ),
    (
        "reward_model, judge_model_type: cluster",
        "rlvr_pipeline.py builds the `reward_model` cluster (InferWorker on vLLM) and a RouterManager in front of it; "
        "in commit bd17364f LLMJudgeRewardWorker `_compute_rewards_cluster` renders each judge prompt with "
        "reward_model's tokenizer and template and sends it with the domain's generating_args. The v0.3.0 publish "
        "(7f9d4d38) dropped that branch from the worker, so at HEAD the example stops with 'Unsupported model type'.",
        "The judge domain takes reward_model's model, strategy and devices: its own workers serve the judge (one "
        "replica per device group), the domain's generating_args become reward_kwargs; the CPU clients' world_size "
        "has no counterpart. Prompt and answer reading are HEAD's (prompt_style ROLL/<judge_prompt>: 'yes' scores 1, "
        "else 0); bd17364f's `_parse_score` read a 'Score: N' (N/10) before yes/no.",
    ),
    (
        "agent_runner_cls: GEMRunner",
        "env_manager/proxy_env_manager.py runs agent_runner/gem_runner.py `GEMRunner.run_job`: system message = "
        "agent_system_template, a blank line, the env instruction; one user message per observation (agent_template); "
        "the score is the sum of step rewards; one trajectory-wise sample.",
        "The traj env manager with `env_instruction_in_system: true` (same messages and score); ROLL's other runners "
        "(ToolCallRunner, the ROCK runners) are refused by name.",
    ),
]

# ROLL's env types that roll does not build, and why: the docs' row and roll-agentic's error for such an env_type.
ROLL_ENVS_NOT_BUILT: dict[str, str] = {
    "webshop": "it runs ROLL's `third_party/webshop-minimal` submodule (not on the package index) and its downloaded "
    "product data",
    "deepeyes": "it plays images with a vision-language model, which roll does not run",
}

# ROLL's registered env types (roll/pipeline/agentic/env/__init__.py), as markdown -> what roll does with them.
# "built in" rows name roll's env of the same name (roll-agentic's tests check that each is registered).
ROLL_ENV_TYPES: list[tuple[str, str]] = [
    ("`frozen_lake`", "built in (roll.agentic.env.frozen_lake); ROLL's defaults written in"),
    ("`sokoban`", "built in (roll.agentic.env.sokoban); ROLL's defaults written in"),
    ("`sokoban_native_env`", "built in (roll.agentic.env.sokoban_native)"),
    (
        "`sokoban_tool_call`",
        "built in (roll.agentic.env.sokoban_tool_call): sokoban_native_env's game with moves as `move_player` tool "
        "calls (tool in the reset `info['tools']`, Hermes `<tool_call>` replies, results as `tool` messages), "
        "`full_history`; the first call of a reply is played (differences in the module's docstring)",
    ),
    ("`rock_tb_native_env`", "built in (roll.agentic.env.rock; the ROCK service and `roll-agentic[rock]`)"),
    (
        "`roll_math`",
        "built in (roll.agentic.env.dataset_envs): a dataset's question, the last `\\boxed{}` graded by roll's math "
        "grader; validation asks the dataset's rows in order, each once as far as the val batch goes",
    ),
    ("`roll_qa`", "built in: `<answer>` (or `\\boxed{}`) by normalised exact match; validated as roll_math"),
    ("`roll_code`", "built in: the last code block against the row's tests in roll's sandbox; validated as roll_math"),
    ("GEM ids (`math:...`, `game:...`, `qa:...`)", "GEM's own envs through `roll-agentic[gem]`"),
    (
        "`sokoban_sandbox`",
        "built in (roll.agentic.env.sokoban_sandbox; a ROCK service and `roll-agentic[rock]`): ROLL's env_config "
        "keys and protocol (a sandbox of `image`, two bash sessions, `cd /app && python server.py &`, a curl health "
        "check, `python client.py reset|action ... --json`); ROLL's image is in ROLL's registry, roll ships its own "
        "/app: `python -m roll.agentic.env.sokoban_sandbox.app --write-app DIR` (and `--dockerfile`); "
        "`sandbox_cls: roll.agentic.env.sokoban_sandbox.local:LocalSandbox` plays without ROCK. Differences: image and "
        "timeouts are settings, seed 0 is a seed, a failed reset raises, a failed step truncates (module docstring)",
    ),
    (
        "`sokoban_mcp`",
        "built in (roll.agentic.env.sokoban_mcp; `roll-agentic[mcp]`): ROLL's env_config keys against an MCP server "
        "at `server_url` (SSE, or streamable HTTP for a URL ending in `/mcp`); roll ships the server: "
        "`python -m roll.agentic.env.sokoban_mcp_server --port 8000` (differences in the module's docstring)",
    ),
    (
        "`openreward_env`",
        "built in (roll.agentic.env.openreward_env; `roll-agentic[openreward]` and `OPENREWARD_API_KEY`): ROLL's "
        "env_config keys, played under the agent-native manager; every call of a reply runs, tool results are `tool` "
        "messages (differences in the module's docstring)",
    ),
    (
        "`atropos_env`",
        "built in (roll.agentic.env.atropos; `roll-agentic[atropos]`): an Atropos (atroposlib BaseEnv) class by "
        "`atropos_env_path`, played under agent_native; ROLL's env_config, max_steps, reward_config "
        "(format_markers, length_bounty_max); each turn replays the episode's earlier answers to the env; its "
        "`group_size` must be 1 (differences in the module's docstring)",
    ),
    (
        ", ".join(f"`{name}`" for name in sorted(ROLL_ENVS_NOT_BUILT)),
        "not built: "
        + "; ".join(f"`{name}`: {why}" for name, why in sorted(ROLL_ENVS_NOT_BUILT.items()))
        + "; an entry fails with an error saying so and naming roll's types",
    ),
]
