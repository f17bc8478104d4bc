"""ROLL's dataset envs (roll_math, roll_qa, roll_code) on small local files: which question a seed picks, grading,
bad rows and files, roll validate's checks, and the tool wrapper."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roll.agentic.config import CustomEnvConfig
from roll.agentic.env import make_env
from roll.agentic.env.dataset_envs import normalize_text
from roll.agentic.pool import build_env, check_env_spec
from roll.pipelines.data import DataError
from roll.pipelines.data.sources import DataNotFoundError
from roll.runtime import ConfigError

QUESTIONS = [
    {"problem": "What is 2 + 3?", "answer": "5"},
    {"problem": "What is 4 * 6?", "answer": "24"},
    {"problem": "What is 10 - 7?", "answer": 3},
    {"problem": "What is 9 / 2?", "answer": "\\frac{9}{2}"},
]


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.fixture
def math_file(tmp_path: Path) -> str:
    return _jsonl(tmp_path / "math.jsonl", QUESTIONS)


def test_a_seed_picks_its_row_the_same_in_every_env(math_file: str) -> None:
    env, other = make_env("roll_math", dataset_name=math_file), make_env("roll_math", dataset_name=math_file)
    assert env.rows is other.rows  # read once per process, shared
    assert [env.reset(seed=s)[0] for s in range(4)] == [q["problem"] for q in QUESTIONS]
    assert env.reset(seed=5)[0] == other.reset(seed=5)[0] == "What is 4 * 6?" and env.index == other.index == 1
    assert env.reset(seed=1_234_567)[0] == QUESTIONS[1_234_567 % 4]["problem"]
    _observation, info = env.reset(seed=0)
    assert info == {"env_instruction": "", "success": False}


@pytest.mark.parametrize(
    ("seed", "response", "reward", "success", "valid"),
    [
        (0, "2 + 3 = 5, so \\boxed{5}", 1.0, True, True),
        (0, "\\boxed{4} no wait \\boxed{5.0}", 1.0, True, True),  # the last box, numerically equal
        (2, "\\boxed{3}", 1.0, True, True),  # an int answer in the file
        (3, "\\boxed{4.5}", 1.0, True, True),  # 9/2 written as a fraction in the file
        (1, "\\boxed{25}", 0.0, False, True),
        (1, "the answer is 24", -0.5, False, False),  # no box: format_penalty
    ],
)
def test_roll_math_grades_the_last_box(math_file, seed, response, reward, success, valid) -> None:
    env = make_env("roll_math", dataset_name=math_file, format_penalty=-0.5)
    env.reset(seed=seed)
    _observation, got, terminated, truncated, info = env.step(response)
    assert (got, info["success"], info["action_is_valid"], terminated, truncated) == (
        reward,
        success,
        valid,
        True,
        False,
    )


def test_other_column_names_and_a_csv_file(tmp_path: Path) -> None:
    path = tmp_path / "q.csv"
    path.write_text("prompt,solution\nWhat is 1 + 1?,2\nWhat is 3 + 3?,6\n")
    env = make_env("roll_math", dataset_name=str(path), question_key="prompt", answer_key="solution")
    assert env.reset(seed=1)[0] == "What is 3 + 3?"
    assert env.step("\\boxed{6}")[1] == 1.0
    # read by roll-pipelines' reader (as data_args files are): its errors name the file
    (tmp_path / "latin1.csv").write_bytes("problem,answer\ncaf\xe9,1\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.csv: not a readable UTF-8 CSV file \(.*\); fix or re-export it"):
        make_env("roll_math", dataset_name=str(tmp_path / "latin1.csv"))


def test_a_folder_of_files_reads_them_in_name_order(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    _jsonl(folder / "b.jsonl", QUESTIONS[2:])
    _jsonl(folder / "a.jsonl", QUESTIONS[:2])
    env = make_env("roll_math", dataset_name=str(folder))
    assert [env.reset(seed=s)[0] for s in range(4)] == [q["problem"] for q in QUESTIONS]


def test_a_row_without_the_key_names_file_row_and_key(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", [*QUESTIONS[:2], {"problem": "What is 1 + 1?"}])
    with pytest.raises(DataError, match=r"bad\.jsonl row 2: missing key 'answer'.*answer_key='answer'"):
        make_env("roll_math", dataset_name=path)
    with pytest.raises(DataError, match=r"row 0: key 'problem' is int"):
        make_env("roll_math", dataset_name=_jsonl(tmp_path / "n.jsonl", [{"problem": 7, "answer": "7"}]))


def test_bad_files_and_names(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="does not exist"):
        make_env("roll_math", dataset_name=str(tmp_path / "missing.jsonl"))
    (tmp_path / "notes.txt").write_text("What is 1 + 1?")
    with pytest.raises(DataError, match="unsupported file type '.txt'"):
        make_env("roll_math", dataset_name=str(tmp_path / "notes.txt"))
    (tmp_path / "broken.jsonl").write_text('{"problem": "x", "answer": "1"}\n{"problem": \n')
    with pytest.raises(DataError, match=r"broken\.jsonl row 1 \(line 2\): invalid JSON"):
        make_env("roll_math", dataset_name=str(tmp_path / "broken.jsonl"))
    with pytest.raises(ConfigError, match="needs env_config.dataset_name"):
        make_env("roll_math", dataset_name="")


def test_a_hub_id_that_cannot_load_names_the_tag_and_dataset(monkeypatch, tmp_path: Path, tokenizer) -> None:
    from roll.agentic.policy import MockPolicyClient, RandomActionPolicy
    from roll.agentic.pool import EnvPool, EnvSlot
    from roll.strategies import GenerationConfig

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    spec = CustomEnvConfig(env_type="roll_math", env_config={"dataset_name": "no-such-org/no-such-set"})
    client = MockPolicyClient(tokenizer, RandomActionPolicy(["1"]))
    pool = EnvPool({"Math": spec}, tokenizer, client, generation_config=GenerationConfig(), sequence_length=256)
    with pytest.raises(
        DataError, match=r"custom_envs\.Math: roll_math env_config\.dataset_name .*no-such-org/no-such-set"
    ):
        pool.add_slots([EnvSlot(0, 0, "Math")])


def test_roll_qa_normalised_match_against_any_answer(tmp_path: Path) -> None:
    rows = [
        {"question": "Where is the Eiffel Tower?", "answer": ["Paris", "Paris, France"]},
        {"question": "2?", "answer": 2},
    ]
    env = make_env("roll_qa", dataset_name=_jsonl(tmp_path / "qa.jsonl", rows))
    observation, info = env.reset(seed=0)
    assert observation == rows[0]["question"] and "<answer>" in info["env_instruction"]
    assert env.step("<answer>Rome</answer> hmm, <answer> the  PARIS! </answer>")[1:3] == (1.0, True)
    env.reset(seed=0)
    assert env.step("<answer>paris, france.</answer>")[1] == 1.0
    env.reset(seed=0)
    _, reward, _, _, info = env.step("<answer>London</answer>")
    assert (reward, info["success"], info["action_is_valid"]) == (0.0, False, True)
    env.reset(seed=1)
    assert env.step("Paris")[4]["action_is_valid"] is False
    boxed = make_env("roll_qa", dataset_name=str(tmp_path / "qa.jsonl"), extract_boxed=True)
    boxed.reset(seed=1)
    assert boxed.step("\\boxed{2}")[1] == 1.0
    assert normalize_text("The  Eiffel-Tower, an icon.") == "eiffeltower icon"


def test_roll_code_runs_the_tests_in_the_sandbox(tmp_path: Path) -> None:
    rows = [
        {"problem": "Print a+b.", "tests": {"inputs": ["1 2\n", "15 27\n"], "outputs": ["3\n", "42\n"]}},
        {"problem": "Define sq.", "tests": json.dumps(["assert sq(3) == 9"])},
        {"problem": "Broken.", "tests": 5},
    ]
    env = make_env("roll_code", dataset_name=_jsonl(tmp_path / "code.jsonl", rows), max_tests=1)
    env.reset(seed=0)
    assert [t.stdin for t in env.tests] == ["15 27\n"]  # max_tests keeps the longest input
    right = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert env.step(right)[1:3] == (1.0, True)
    env.reset(seed=0)
    _, reward, _, _, info = env.step("```python\nprint(0)\n```")
    assert (reward, info["success"], info["action_is_valid"]) == (0.0, False, True) and "wrong answer" in info["reason"]
    env.reset(seed=0)
    assert env.step("print(3)")[4]["action_is_valid"] is False
    env.reset(seed=1)
    assert env.step("```python\ndef sq(x):\n    return x * x\n```")[1] == 1.0
    with pytest.raises(DataError, match=r"code\.jsonl row 2: key 'tests' holds no usable tests"):
        env.reset(seed=2)


def test_misspelled_keys_are_named_with_the_accepted_ones(math_file: str) -> None:
    with pytest.raises(ConfigError, match=r"accepted keys: \['dataset_name', 'split', 'question_key', 'answer_key'"):
        make_env("roll_math", dataset_name=math_file, anwser_key="answer")
    with pytest.raises(ConfigError, match="test_key"):
        check_env_spec(
            "Code", CustomEnvConfig(env_type="roll_code", env_config={"dataset_name": math_file, "tests": 1})
        )


def test_validate_reads_a_local_dataset_and_notes_a_hub_one(math_file: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    line = check_env_spec("Math", CustomEnvConfig(env_type="roll_math", env_config={"dataset_name": math_file}))
    assert line == f"Math: env_type 'roll_math' (RollMathEnv); 4 questions in {math_file}"
    missing = CustomEnvConfig(env_type="roll_math", env_config={"dataset_name": str(tmp_path / "nope.jsonl")})
    with pytest.raises(DataNotFoundError, match=r"custom_envs\.Math: .*nope\.jsonl"):
        check_env_spec("Math", missing)
    bad = _jsonl(tmp_path / "bad.jsonl", [{"problem": "x"}])
    with pytest.raises(DataError, match=r"custom_envs\.Math: roll_math: .*bad\.jsonl row 0: missing key 'answer'"):
        check_env_spec("Math", CustomEnvConfig(env_type="roll_math", env_config={"dataset_name": bad}))


def test_validate_notes_a_hub_dataset_that_is_downloaded_at_run_time(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("datasets")  # hub ids need roll-pipelines[datasets]; without it the error names the extra
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub = CustomEnvConfig(env_type="roll_qa", env_config={"dataset_name": "axon-rl/HotpotQA", "split": "train"})
    assert "axon-rl/HotpotQA is downloaded at run time" in check_env_spec("QA", hub)


def test_tools_answer_until_a_response_without_a_call(math_file: str) -> None:
    spec = CustomEnvConfig(
        env_type="roll_math",
        env_config={"dataset_name": math_file, "max_steps": 10},
        tool_wrapper={"wrapper_args": {"max_tool_uses": 2}, "tool_configs": [{"tool_id": "python_code"}]},
    )
    env = build_env(spec)
    observation, _ = env.reset(seed=1)
    assert observation.startswith("What is 4 * 6?") and "python_code" in observation
    call = '<tool_call>{"name": "python_code", "arguments": {"code": "print(4 * 6)"}}</tool_call>'
    observation, reward, terminated, _, info = env.step(call)
    assert (observation.strip(), terminated, info["use_tool"]) == ("python_code result:\n24", False, True)
    _, reward, terminated, _, info = env.step("\\boxed{24}")
    assert (reward, terminated, info["success"], info["metrics"]["tool_success_counter"]) == (1.0, True, True, 1)


def test_a_save_to_disk_folder_gives_the_named_split(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = {"problem": ["1+1?", "2+2?"], "answer": ["2", "4"]}
    held = {"problem": ["3+3?"], "answer": ["6"]}
    folder = tmp_path / "saved"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict(held)}
    ).save_to_disk(str(folder))
    env = build_env(CustomEnvConfig(env_type="roll_math", env_config={"dataset_name": str(folder), "split": "test"}))
    assert env.reset(seed=0)[0] == "3+3?"
    with pytest.raises(DataError, match="no split 'dev'"):
        build_env(CustomEnvConfig(env_type="roll_math", env_config={"dataset_name": str(folder), "split": "dev"}))


def test_longest_rows_counts_tokens_and_ranks_by_them(tokenizer, monkeypatch) -> None:
    from roll.agentic.env import dataset

    dense = "ж€ψ" * 10  # 30 characters, several byte-level tokens each
    rows = [{"q": "What is 1 + 1?"}, {"q": dense}, {"q": "What is 12 * 34? " * 3}, {"q": "What is 2 + 2?"}]
    count = [len(tokenizer(row["q"], add_special_tokens=False)["input_ids"]) for row in rows]
    assert count[1] > count[2] and len(dense) < len(rows[2]["q"])
    ranked = dataset.longest_rows(rows, "q", tokenizer, dataset="d.jsonl")
    assert (ranked.rows, ranked.every_row) == (4, True)
    assert ranked.tokens == sorted(enumerate(count), key=lambda item: (-item[1], item[0]))
    assert ranked.rows_over(count[2]) == 1
    # a large dataset: only the longest by characters are tokenized, so a row dense in tokens can be missed
    monkeypatch.setattr(dataset, "COUNTED_CHARS", 10)
    monkeypatch.setattr(dataset, "CANDIDATE_ROWS", 1)
    ranked = dataset.longest_rows(rows, "q", tokenizer, dataset="d.jsonl")
    assert (ranked.every_row, ranked.tokens) == (False, [(2, count[2])])
