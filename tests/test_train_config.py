"""The composed training config, and the checks that stop a bad one before any model loads."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import hydra
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from tandem.assets import TINY_WORLD
from tandem.config import (
    ConfigError,
    _check_ranges,
    _problems_before_imports,
    check_sampler,
    config_error_message,
    validate_train_config,
)
from tandem.engine import SamplingParams
from tandem.registry import SAMPLERS
from tests.refusal import child_environment, train_cli

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def train_config(*overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def test_defaults_compose_and_validate() -> None:
    cfg = train_config()
    assert cfg.sampler.name == "word"
    assert cfg.reward.name == "boxed_math"
    assert cfg.model.name_or_path == "tiny"
    validate_train_config(cfg)


@pytest.mark.parametrize("sampler", ["solo", "token", "word", "sentence", "step"])
def test_every_sampler_config_validates(sampler: str) -> None:
    validate_train_config(train_config(f"sampler={sampler}"))


@pytest.mark.parametrize("experiment", ["trl", "grpo", "kl_reg"])
def test_experiment_arms_validate(experiment: str) -> None:
    validate_train_config(train_config(f"experiment={experiment}"))


def _problems(*overrides: str, world_size: int = 1) -> str:
    with pytest.raises(ConfigError) as err:
        validate_train_config(train_config(*overrides), world_size)
    return str(err.value)


def test_unknown_sampler_lists_the_known_ones() -> None:
    message = _problems("sampler.name=wrod")
    assert "sampler.name: unknown sampler 'wrod'" in message
    assert "Did you mean 'word'?" in message


def test_p_outside_unit_interval() -> None:
    message = _problems("sampler.p=1.5")
    assert "sampler.p (1.5) must be a probability in [0, 1]" in message


def test_sampler_values_are_checked_before_anything_loads() -> None:
    problems = _problems(
        "sampler=word_authors",
        "sampler.boundary=space",
        "+validation.sampler.max_gap_tokens=0",
    )
    assert "sampler: boundary ('space') must be one of ('onset', 'leading_space')" in problems
    assert "validation.sampler: max_gap_tokens (0) must be at least 1" in problems


def test_batch_size_not_a_multiple_of_group_size() -> None:
    message = _problems("batch_size=12", "group_size=8")
    assert "batch_size (12) must be divisible by group_size (8)" in message
    assert "Set batch_size to a multiple of 8" in message


def test_batch_must_split_into_whole_groups_per_rank() -> None:
    message = _problems("batch_size=24", "group_size=8", world_size=2)
    assert "multiple of 16" in message


def test_model_path_that_does_not_exist() -> None:
    message = _problems("model.name_or_path=/no/such/model")
    assert "model.name_or_path ('/no/such/model') is not a model folder" in message


def test_all_problems_are_reported_at_once() -> None:
    message = _problems(
        "sampler.p=-1",
        "batch_size=7",
        "generation.temperature=0",
        "module.loss.aggregation=sum",
        "validation.monitor=val/loss",
    )
    assert message.startswith("5 problem(s)")
    for key in (
        "sampler.p",
        "batch_size (7)",
        "generation.temperature",
        "aggregation",
        "validation.monitor",
    ):
        assert key in message


def test_unknown_sampler_argument_is_named() -> None:
    message = _problems("+sampler.prob=0.3")
    assert "unknown argument 'prob'" in message


def test_the_readme_sweep_composes_for_every_sampler() -> None:
    for sampler in ("word", "token", "sentence"):
        for p in ("0.25", "0.5", "0.75"):
            validate_train_config(train_config(f"sampler={sampler}", f"sampler.p={p}"))


# the CPU trainers compute in float32: a bfloat16 senior asks for bfloat16 compute
BF16_COMPUTE = {
    "gpu": [],
    "ddp": ["trainer.precision=bf16-mixed"],
    "fsdp": ["trainer.strategy.param_dtype=bfloat16"],
    "fsdp_gpu": [],
}


@pytest.mark.parametrize("trainer", sorted(BF16_COMPUTE))
def test_paper_scale_configs_compose(trainer: str, hub_online: None) -> None:
    cfg = train_config(
        "model=qwen3_4b",
        "data=deepscaler",
        f"trainer={trainer}",
        "experiment=trl",
        *BF16_COMPUTE[trainer],
    )
    validate_train_config(cfg, world_size=2 if trainer != "gpu" else 1)
    assert cfg.model.name_or_path == "Qwen/Qwen3-4B-Instruct-2507"
    assert cfg.data.holdout > 0


def test_a_typo_in_the_sharding_strategy_is_named() -> None:
    problems = _problems("trainer=fsdp", "+trainer.strategy.ofload=fsdp")
    assert "trainer.strategy" in problems and "offload" in problems


def test_rollout_backend_is_checked_before_anything_loads() -> None:
    validate_train_config(train_config("module.backend.name=vllm", "+module.backend.sync_every=2"))
    problems = _problems("module.backend.name=sglang")
    assert "module.backend.name" in problems and "vllm" in problems
    problems = _problems("+module.backend.sync_evry=2")
    assert "sync_evry" in problems


# -- every key of every group is known --------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "named", "suggested"),
    [
        ("+sed=1", "sed is not a key of the top level", "seed"),
        ("+generation.temprature=1", "generation.temprature", "generation.temperature"),
        ("+validation.evry_n_steps=2", "validation.evry_n_steps", "validation.every_n_steps"),
        ("+model.dtyp=float32", "model.dtyp", "model.dtype"),
        ("+module.optimizer.lrr=1", "module.optimizer.lrr", "module.optimizer.lr"),
        ("+module.schedular=null", "module.schedular", "module.scheduler"),
        ("+module.loss.clip_hgh=0.3", "module.loss.clip_hgh", "module.loss.clip_high"),
        ("+data.max_prompt_token=9", "data.max_prompt_token", "data.max_prompt_tokens"),
        ("+data.sed=1", "data.sed", "data.seed"),
        ("+trainer.max_stesp=3", "trainer.max_stesp", "trainer.max_steps"),
        ("+logger.1.save_dri=x", "logger.1.save_dri", "logger.1.save_dir"),
        ("+reward.timout=1", "unknown argument 'timout'", "'timeout'"),
    ],
)
def test_a_key_added_with_a_typo_is_named_with_the_closest(
    override: str, named: str, suggested: str
) -> None:
    message = _problems(override)
    assert message.startswith("1 problem(s)"), message
    assert named in message and suggested in message


def test_a_plain_override_of_a_missing_key_gets_a_did_you_mean() -> None:
    with pytest.raises(ConfigCompositionException) as err:
        train_config("generation.temprature=0.5")
    message = config_error_message(err.value)
    assert message.startswith("generation.temprature is not a key of generation")
    assert "Did you mean generation.temperature?" in message
    assert "+generation.temprature=" in message  # how to add a key that really is new


@pytest.mark.parametrize(
    ("override", "instead"),
    [
        ("module.seed=3", "from seed"),
        ("module.group_size=4", "from group_size"),
        ("+generation.samples_per_prompt=4", "from group_size"),
        ("+trainer.gradient_clip_val=1.0", "from module.max_grad_norm"),
        ("+trainer.val_check_interval=5", "from validation.every_n_steps"),
    ],
)
def test_a_key_the_run_sets_itself_names_the_key_to_set(override: str, instead: str) -> None:
    message = _problems(override)
    assert "is set by the run itself" in message and instead in message


# -- ranges ------------------------------------------------------------------------------------


def test_a_group_of_one_is_refused_with_the_reason() -> None:
    message = _problems("group_size=1", "batch_size=8")
    assert "group_size (1) must be an integer >= 2" in message
    assert "advantage 0" in message and "Set group_size=8" in message


@pytest.mark.parametrize(
    ("override", "rule"),
    [
        ("module.max_grad_norm=-1", "module.max_grad_norm (-1) must be a number > 0, or null"),
        ("module.optimizer.lr=0", "module.optimizer.lr (0) must be a number > 0"),
        (
            "module.optimizer.weight_decay=-0.1",
            "module.optimizer.weight_decay (-0.1) must be a number >= 0",
        ),
        ("checkpoint_every_n_steps=0", "checkpoint_every_n_steps (0) must be an integer >= 1"),
        ("validation.size=0", "validation.size (0) must be an integer >= 1, or null"),
        ("validation.every_n_steps=0", "validation.every_n_steps (0) must be an integer >= 1"),
        (
            "module.max_tokens_per_micro_batch=0",
            "module.max_tokens_per_micro_batch (0) must be an integer >= 1",
        ),
        ("module.logprob_chunk_tokens=0", "module.logprob_chunk_tokens (0) must be an integer"),
        ("validation.temperature=-1", "validation.temperature (-1) must be a number >= 0"),
        ("generation.temperature=0", "generation.temperature (0) is greedy"),
        ("generation.temperature=-1", "generation.temperature (-1) must be a number >= 0"),
        ("generation.top_p=1.5", "generation.top_p (1.5) must be a number in (0, 1]"),
        ("generation.top_k=-1", "generation.top_k (-1) must be an integer >= 0"),
        ("generation.max_new_tokens=0", "generation.max_new_tokens (0) must be an integer >= 1"),
        ("data.max_prompt_tokens=0", "data.max_prompt_tokens (0) must be an integer >= 1, or"),
        ("trainer.max_steps=-1", "trainer.max_steps (-1) must be an integer >= 1"),
        ("seed=-3", "seed (-3) must be an integer >= 0"),
        ("threads=0", "threads (0) must be an integer >= 1, or null"),
        ("model.dtype=float8", "model.dtype ('float8') must be one of"),
    ],
)
def test_every_numeric_key_has_a_range(override: str, rule: str) -> None:
    assert rule in _problems(override)


def test_null_turns_features_off() -> None:
    validate_train_config(
        train_config(
            "module.max_grad_norm=null",
            "validation.size=null",
            "threads=null",
            "data.max_prompt_tokens=null",
        )
    )


# -- hub names on a machine that cannot reach the hub ------------------------------------------

# a name that no cache holds
NO_SUCH_MODEL = "tandem-tests/no-such-model"


@pytest.fixture
def hub_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub that never answers: every request hangs far longer than anyone would wait."""
    import tandem.hub

    class Hanging:
        def head(self, *args: object, **kwargs: object) -> None:
            time.sleep(120)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(tandem.hub, "get_session", Hanging)
    tandem.hub.hub_reachable.cache_clear()
    yield
    tandem.hub.hub_reachable.cache_clear()


def test_a_hub_name_the_hub_cannot_serve_is_refused_in_seconds(hub_unreachable: None) -> None:
    start = time.monotonic()
    message = _problems(f"model.name_or_path={NO_SUCH_MODEL}", "group_size=1", "batch_size=4")
    elapsed = time.monotonic() - start
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert f"model.name_or_path ('{NO_SUCH_MODEL}') is not a local folder" in message
    assert "cannot be reached" in message and "HF_HUB_OFFLINE=1" in message
    assert "group_size (1)" in message, "the other problems are still reported"


def test_hf_hub_offline_refuses_without_asking_the_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tandem.hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(tandem.hub, "hub_reachable", lambda: pytest.fail("asked the network"))
    message = _problems("model=qwen3_4b", "data=deepscaler")
    assert "model.name_or_path ('Qwen/Qwen3-4B-Instruct-2507')" in message
    assert "data.path ('agentica-org/DeepScaleR-Preview-Dataset')" in message
    assert message.count("HF_HUB_OFFLINE is set") == 2


# -- data files --------------------------------------------------------------------------------


def _file_problems(path: Path) -> str:
    return _problems(
        "data=deepscaler", "data.path=json", f"+data.data_files={path}", "data.holdout=1"
    )


def test_a_missing_data_file_is_named_with_its_key(tmp_path: Path) -> None:
    message = _file_problems(tmp_path / "nowhere.jsonl")
    assert f"data.data_files ('{tmp_path / 'nowhere.jsonl'}'): no such file" in message


def test_an_empty_data_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    assert "data.data_files" in (message := _file_problems(tmp_path / "empty.jsonl"))
    assert "is empty" in message


def test_a_byte_that_is_not_utf8_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    rows = ['{"problem": "1 + 1?", "answer": "2"}', '{"problem": "caf\xe9?", "answer": "1"}']
    path.write_bytes("\n".join(["", *rows]).encode("latin-1"))  # the bad byte is on line 3
    message = _file_problems(path)
    assert "data.data_files" in message and str(path) in message
    assert "line 3 is not UTF-8 (byte 0xe9 at column 17)" in message


def test_a_jsonl_line_that_is_not_json_is_named(tmp_path: Path) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text('{"problem": "1 + 1?", "answer": "2"}\n{"problem": "2 + 2?", "answer": 4\n')
    assert "line 2 is not JSON" in _file_problems(path)


def test_a_jsonl_error_is_named_at_its_own_column(tmp_path: Path) -> None:
    path = tmp_path / "set.jsonl"
    unclosed = '{"problem": "what is 2 + 3?", "answer": "5"'  # 43 characters, no closing brace
    stray = '{"problem": "2 + 2?" "answer": "4"}'  # the comma is missing before "answer"
    path.write_text(unclosed + "\n")
    assert "line 1 is not JSON (Expecting ',' delimiter at column 44, the end of the line)" in (
        _file_problems(path)
    )
    path.write_text('{"problem": "1 + 1?", "answer": "2"}\r\n' + stray + "\r\n")
    assert "line 2 is not JSON (Expecting ',' delimiter at column 22)" in _file_problems(path)


def test_files_of_every_split_and_glob_are_checked(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"problem": "1 + 1?", "answer": "2"}\n')
    (tmp_path / "empty.csv").write_text("")
    message = _problems(
        "data=deepscaler",
        "data.path=json",
        "data.holdout=0",
        f"+data.data_files={{train: {good}, validation: '{tmp_path}/*.csv'}}",
        "+data.splits.validation=validation",
    )
    assert message.startswith("1 problem(s)")
    assert f"data.data_files.validation ('{tmp_path}/empty.csv') is empty" in message


# -- the command line: exit status 2, one message, no traceback --------------------------------


def _cli(*overrides: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tandem.train", "hydra.run.dir=${oc.env:TMPDIR,/tmp}", *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def _one_message(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("config error: ")
    assert all(line.startswith("- ") for line in lines[1:]), lines
    return lines


def test_the_command_line_reports_the_configs_own_problems_then_every_other_at_once(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"problem": "caf\xe9", "answer": "1"}\n')
    overrides = (
        f"model.name_or_path={NO_SUCH_MODEL}",
        "+module.optimizer.lrr=1",
        "batch_size=4",
        "data=deepscaler",
        "data.path=json",
        f"+data.data_files={bad}",
        "data.holdout=1",
    )
    # a closed local port: the hub probe is refused at once, as on a machine without network
    env = {"HF_ENDPOINT": "http://127.0.0.1:9"}
    proc = _cli(*overrides, "group_size=1", env=env)
    # what the config alone shows (its values, every key of every component) is refused first,
    # before any model library is imported
    header, *lines = _one_message(proc)
    assert header.startswith("config error: 2 problem(s) in the config (the model, the data")
    assert any("group_size (1)" in line for line in lines)
    assert any("optimizer.lrr" in line and "module.optimizer.lr?" in line for line in lines)
    start = time.monotonic()
    fixed = [o for o in overrides if "lrr" not in o]
    proc = _cli(*fixed, "group_size=2", env=env)
    elapsed = time.monotonic() - start
    lines = _one_message(proc)
    assert lines[0] == "config error: 2 problem(s) in the config:"
    assert any(f"{bad}'): line 1 is not UTF-8" in line for line in lines)
    assert any("model.name_or_path" in line and "cannot be reached" in line for line in lines)
    # the hub's retries this replaces took 54 s on their own; what is left is starting Python
    # and torch (15-45 s on a busy 2-core machine, the suite's other worker beside it)
    assert elapsed < 50, f"took {elapsed:.1f} s"


def test_the_command_line_names_a_plain_typo() -> None:
    (line,) = _one_message(_cli("trainer.max_stesp=3"))
    assert "trainer.max_stesp is not a key of trainer" in line
    assert "Did you mean trainer.max_steps?" in line


def test_the_module_group_builds_the_module_and_its_optimizer() -> None:
    # another optimizer is checked against its own arguments: SGD has no betas
    problems = _problems("module.optimizer._target_=torch.optim.SGD")
    assert problems.startswith("1 problem(s)") and "module.optimizer.betas" in problems
    cfg = train_config(
        "module.optimizer._target_=torch.optim.SGD",
        "~module.optimizer.betas",
        "module.optimizer.lr=0.125",
        "seed=7",
    )
    validate_train_config(cfg)
    module = hydra.utils.instantiate(cfg.module, _convert_="all")
    assert module.hparams.seed == 7 and module.hparams.generation == dict(cfg.generation)
    module.configure_model()
    conf = module.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]
    assert isinstance(opt, torch.optim.SGD)
    assert isinstance(sched, torch.optim.lr_scheduler.LinearLR)
    # the warmup's first step: lr x start_factor
    assert opt.param_groups[0]["lr"] == pytest.approx(0.125 * 0.2)
    module = hydra.utils.instantiate(train_config("module.scheduler=null").module)
    module.configure_model()
    assert isinstance(module.configure_optimizers(), torch.optim.AdamW), "no scheduler"


def test_a_config_error_is_refused_before_torch_lightning_or_transformers_load(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    # Hydra's own refusal of a key the config lacks, then ours of values
    typos = ("sampler.pp=0.3", "generation.temperature=0", "batch_size=7", "trainer.devices=0")
    for override in typos:
        proc, heavy = train_cli(f"hydra.run.dir={run}", override)
        assert proc.returncode == 2 and proc.stderr.startswith("config error: "), proc.stderr
        assert heavy == [], f"{override}: refused only after importing {heavy}"
        # the refused start leaves no folder that holds nothing
        assert not run.exists(), sorted(p.name for p in run.iterdir())


def test_devices_0_is_one_message_with_no_start_recorded(tmp_path: Path) -> None:
    proc = _cli(f"hydra.run.dir={tmp_path / 'run'}", "trainer.devices=0")
    _, line = _one_message(proc)
    assert "Error executing job" not in proc.stderr + proc.stdout
    assert line.startswith("- trainer.devices (0) must be an integer >= 1"), line
    assert not (tmp_path / "run").exists()  # no run_info.json, no empty folder


@pytest.mark.parametrize(
    ("devices", "ok"),
    [
        *[(1, True), (-1, True), ("auto", True), ([0, 1], True), ("0,1", True), ("2", True)],
        *[(0, False), ("0", False), ([], False), (-2, False), ("x", False), (True, False)],
    ],
)
def test_devices_takes_what_lightning_takes_less_no_device(devices, ok: bool) -> None:
    cfg = train_config()
    cfg.trainer.devices = devices
    problems: list[str] = []
    _check_ranges(problems, OmegaConf.to_container(cfg, resolve=False))
    assert (problems == []) is ok, problems


def test_defaults_stay_fast_when_the_cores_are_shared(tmp_path: Path) -> None:
    # one torch thread, and OpenMP's waiting threads asleep rather than spinning: with torch's
    # defaults a step on a busy 2-core machine took 5-10x as long (benchmarks/threads.py)
    assert train_config().threads == 1
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    proc, heavy = train_cli(f"hydra.run.dir={tmp_path / 'run'}", "batch_size=7", env=env)
    assert proc.returncode == 2 and heavy == []  # set before torch could read it
    assert child_environment(proc)["OMP_WAIT_POLICY"] == "PASSIVE"
    # a user's own choice stands
    proc, _ = train_cli(f"hydra.run.dir={tmp_path / 'run'}", "batch_size=7",
                        env={**env, "OMP_WAIT_POLICY": "ACTIVE"})  # fmt: skip
    assert child_environment(proc)["OMP_WAIT_POLICY"] == "ACTIVE"


# values on both sides of every rule of a number, and of other types
PROBES = (-1, 0, 1e-9, 0.5, 1, 1.5, 2, 3, 1024, None, True, "x", [1])


def _refused(key: str, value) -> bool:
    """Whether the config check refuses ``key=value`` (before anything loads)."""
    cfg = train_config()
    OmegaConf.update(cfg, key, value, force_add=True)
    c = OmegaConf.to_container(cfg, resolve=False)
    return any(p.startswith(f"{key} (") for p in _problems_before_imports(c, 1))


@pytest.mark.parametrize(
    "key, field",
    [
        *((f"generation.{f}", f) for f in ("max_new_tokens", "temperature", "top_p", "top_k")),
        ("generation.kv_cache_gib", "kv_cache_gib"),
        ("validation.temperature", "temperature"),
        ("validation.top_p", "top_p"),
        ("module.logprob_temperature", "logprob_temperature"),
    ],
)
def test_the_config_check_and_sampling_params_agree(key: str, field: str) -> None:
    # a value the engine takes is one the config takes, except where the run says otherwise:
    # training refuses greedy rollouts (temperature 0, top_k 1), and validation.top_p null
    # means the rollouts' own
    differ = {
        ("generation.temperature", "0"): True,
        ("generation.top_k", "1"): True,
        ("validation.top_p", "None"): False,
    }
    for value in PROBES:
        try:
            SamplingParams(**{field: value})
            engine_refuses = False
        except (ValueError, TypeError):
            engine_refuses = True
        expected = differ.get((key, repr(value)), engine_refuses)
        assert _refused(key, value) == expected, (key, value)


@pytest.mark.parametrize("field", ["p", "max_gap_tokens"])
def test_the_config_check_and_the_sampler_agree(field: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(TINY_WORLD)
    for value in PROBES:
        try:
            SAMPLERS.build("word", tokenizer=tokenizer, **{field: value})
            refuses = False
        except (ValueError, TypeError):
            refuses = True
        problems = []
        check_sampler(problems, "sampler", {"name": "word", field: value})
        assert bool(problems) == refuses, (field, value, problems)
