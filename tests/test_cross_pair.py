"""A junior of another family end to end on the tiny world, as the guide runs it: training with
``model=tiny_cross`` and evaluating with ``junior=tiny-bpe-small sampler=word``."""

from __future__ import annotations

import csv
import importlib
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file

from tandem.assets import TINY_BPE_SMALL, TINY_WORLD
from tandem.evaluate import run as evaluate
from tandem.train import run
from tests.modules.test_train import TINY  # the tiny training run the module tests use

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def compose_config(name: str, *overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


def test_training_with_a_junior_of_another_vocabulary(tmp_path: Path) -> None:
    cfg = compose_config(
        "train", *TINY, "model=tiny_cross", "trainer.max_steps=2", f"output_dir={tmp_path}"
    )
    metrics = run(cfg)
    assert 0.0 < metrics["train/senior_share"] < 1.0, "both models wrote"
    assert metrics["train/handoffs_per_rollout"] > 0
    # nats per byte of the senior's words: the trained junior reads them at 0.2-0.5, an
    # untrained model of its shape at 2.4-3.2
    assert 0.0 < metrics["train/junior_ce_per_byte"] < 1.0
    assert "train/kl" not in metrics, "no per-token KL to a junior of another vocabulary"
    base, trained = (
        load_file(str(TINY_WORLD / "model.safetensors")),
        load_file(str(tmp_path / "senior" / "model.safetensors")),
    )
    assert any(not torch.equal(base[k], trained[k]) for k in base), "the senior moved"
    (path,) = tmp_path.glob("csv/version_*/metrics.csv")
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/engine_logprob_gap")]
    # the engine's log-probs are the trainer's on the senior's own sequence
    assert rows and all(float(r["train/engine_logprob_gap"]) < 1e-4 for r in rows)


@pytest.mark.parametrize("drift", [True, False])
def test_evaluating_with_a_junior_of_another_vocabulary(tmp_path: Path, drift: bool) -> None:
    cfg = compose_config(
        "evaluate",
        "junior=tiny-bpe-small",
        "sampler=word",
        "eval.tiny.limit=4",
        "eval.tiny.n=2",
        "eval.tiny.ks=[1,2]",
        "eval.tiny.max_new_tokens=48",
        f"drift={str(drift).lower()}",
        "aim=false",
        "progress=false",
        f"output_dir={tmp_path}",
    )
    table = evaluate(cfg)["sets"]["tiny"]
    assert 0.0 < table["handoff/senior_share"] < 1.0
    if drift:
        # the senior is its own base here: no drift, against the base and not the junior
        assert table["drift/kl"] == pytest.approx(0.0, abs=1e-6)
        assert 0.0 < table["legibility/junior_ce_per_byte"] < 1.0
    for key in ("legibility/junior_ce", "legibility/junior_ce_pooled", "legibility/overlap"):
        assert key not in table, f"{key} does not apply across vocabularies"


# a chat format of another family: the tiny pair shares one, so the junior's own is made here
OTHER_TEMPLATE = (
    "{% for m in messages %}### {{ m['role'] }}:\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}### assistant:\n{% endif %}"
)


@pytest.fixture
def junior_of_another_format(tmp_path: Path) -> Path:
    """``tiny-bpe-small`` with a chat template of its own (another family's format)."""
    folder = tmp_path / "junior"
    shutil.copytree(TINY_BPE_SMALL, folder)
    (folder / "chat_template.jinja").write_text(OTHER_TEMPLATE)
    return folder


def evaluate_briefly(junior: Path, out: Path) -> dict:
    """The tiny base evaluated with ``junior`` on two problems, two samples each: its table."""
    cfg = compose_config(
        "evaluate",
        f"junior={junior}",
        "sampler=word",
        "eval.tiny.limit=2",
        "eval.tiny.n=2",
        "eval.tiny.ks=[1,2]",
        "eval.tiny.max_new_tokens=24",
        "aim=false",
        "progress=false",
        f"output_dir={out}",
    )
    return evaluate(cfg)["sets"]["tiny"]


def spy_on_junior_prompts(monkeypatch) -> list[str]:
    """The junior's prompts, decoded, of every cross-vocabulary rollout."""
    seen: list[str] = []
    # the module, not the function of the same name that tandem.engine exports
    generate_module = importlib.import_module("tandem.engine.generate")
    real = generate_module.generate_cross

    def spy(*args, junior_tokenizer, junior_prompts=None, **kwargs):
        assert junior_prompts is not None, "the junior's own prompts are passed"
        seen.extend(junior_tokenizer.batch_decode([list(p) for p in junior_prompts]))
        return real(
            *args, junior_tokenizer=junior_tokenizer, junior_prompts=junior_prompts, **kwargs
        )

    monkeypatch.setattr(generate_module, "generate_cross", spy)
    return seen


def test_a_junior_reads_the_prompts_in_its_own_chat_format(
    tmp_path: Path, junior_of_another_format: Path, monkeypatch
) -> None:
    seen = spy_on_junior_prompts(monkeypatch)
    cfg = compose_config(
        "train",
        *TINY,
        "model=tiny_cross",
        f"model.junior_name_or_path={junior_of_another_format}",
        "trainer.max_steps=1",
        f"output_dir={tmp_path / 'run'}",
    )
    run(cfg)
    assert seen and all(p.startswith("### user:\n") for p in seen), seen[:1]
    assert all(p.endswith("\n### assistant:\n") and "<|im_start|>" not in p for p in seen)
    seen.clear()
    table = evaluate_briefly(junior_of_another_format, tmp_path / "eval")
    assert seen and all(p.startswith("### user:\n") for p in seen)
    assert 0.0 < table["legibility/junior_ce_per_byte"] < 5.0


def test_the_junior_is_teacher_forced_after_its_own_prompts(junior_of_another_format) -> None:
    """Legibility reads the junior after the prompt in its own format: the figure changes when
    the format does, and equals forcing by hand."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tandem.data.prompts import prompt_ids
    from tandem.evaluation.forcing import junior_logprobs

    tok = AutoTokenizer.from_pretrained(junior_of_another_format)
    model = AutoModelForCausalLM.from_pretrained(junior_of_another_format).eval()
    problems, responses = ["Ana has 3 pens and buys 4 more."], [" 3 + 4 = 7, so \\boxed{7}."]
    own = prompt_ids(tok, problems)
    lps, tokens, mask = junior_logprobs(model, tok, own, responses, batch_size=4)
    ids = torch.tensor([own[0] + tokens[0][mask[0]].tolist()])
    with torch.no_grad():
        logits = model(ids).logits[0, len(own[0]) - 1 : -1]
    want = logits.log_softmax(-1).gather(1, ids[0, len(own[0]) :, None]).squeeze(1)
    assert torch.allclose(lps[0][mask[0]], want, atol=1e-5)
    other = prompt_ids(AutoTokenizer.from_pretrained(TINY_BPE_SMALL), problems)
    assert other != own
    lps_other, _, _ = junior_logprobs(model, tok, other, responses, batch_size=4)
    assert not torch.allclose(lps_other[0][mask[0]], lps[0][mask[0]])


def test_a_junior_with_no_chat_template_reads_the_seniors_prompt_text(tmp_path: Path) -> None:
    """A base model of another family has no chat template: it is said once, and the pair
    writes with the senior's prompt text re-tokenized."""
    from transformers import AutoTokenizer

    from tandem.data.datamodule import PromptBatch

    folder = tmp_path / "junior"
    shutil.copytree(TINY_BPE_SMALL, folder)
    (folder / "chat_template.jinja").unlink()
    tok = AutoTokenizer.from_pretrained(folder)
    assert not tok.chat_template
    batch = PromptBatch(["Ana has 3 pens."], ["3"], [[1, 2, 3]])
    assert batch.prompt_ids_for(tok) is None
    own = PromptBatch(["Ana has 3 pens."], ["3"], [[1, 2, 3]], separator=" ")
    with_template = AutoTokenizer.from_pretrained(TINY_BPE_SMALL)
    text = with_template.decode(own.prompt_ids_for(with_template)[0])
    assert "Ana has 3 pens. Put the final answer" in text, "the batch's separator is kept"
    table = evaluate_briefly(folder, tmp_path / "eval")
    assert 0.0 < table["legibility/junior_ce_per_byte"] < 5.0
