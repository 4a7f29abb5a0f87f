"""The vLLM backend: solo sampling at scale, and tandem generation in one or two vLLM engines.

Solo: one request per rollout row (``samples_per_prompt`` rows share their prompt's prefix
cache), the raw log-prob of each sampled token from vLLM (``logprobs_mode="raw_logprobs"``: the
model's own log-softmax at temperature 1, before temperature, top-k/top-p and logits
processors; the torch engine records the same quantity).

Tandem, ``engine="pair"`` (``auto`` where the two models share a shape): one engine holding
both models (``tandem.engine.vllm_pair``), a batch in one ``generate`` call, the schedule
stepped per row by the pen processor (``tandem.engine.vllm_pens``), which records each token's
author and its log-probs under both models.

Tandem, ``engine="turns"``: a senior engine and a junior engine over the same context, in turns.
A turn is one request to its author's engine; a logits processor steps the handoff sampler over
the author's tokens as they come (the sampler's own ``step``, on one row, with the row's coins:
the schedule is defined once, in ``tandem.samplers``) and forces a stop token once the sampler
hands the pen over; the backend replays the same steps over the output, with the same coins, and
cuts it there. The next turn is a request to the other engine with the shared context as its
prompt, which prefix caching makes cheap to re-read. Where the sampler retracts a token (the
word sampler's ``onset`` rule), the next turn's first token is drawn from ``sampler.allowed``,
as the torch engine's redraw is. Each token's log-prob under the model that did not write it
comes from one teacher-forced pass (``prompt_logprobs``) per engine at the end.

Weights: ``load_weights`` puts the senior's new weights into the running engine in-process
(``LLM.collective_rpc("reload_weights", weights_iterator=...)``, then ``reset_prefix_cache`` so
that no KV computed under the old weights is reused) and records the step they come from in
``weights_step``, which ``generate`` logs with every batch. This needs the engine in this
process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set here unless the environment says otherwise).

An FSDP-sharded senior's parameters are ``DTensor`` shards: ``load_weights`` gathers each whole
(``full_tensor``) as vLLM reads it, one tensor at a time, so no rank holds a second full copy.

What this file leaves out: a turn inside the engine (``tandem.engine.vllm_turns``: the logits
processor and the schedule it steps) and tensor/pipeline parallel engines.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tandem.assets import resolve
from tandem.engine.backend import Weights
from tandem.engine.base import JUNIOR, PAD, SENIOR, Rollouts, SamplingParams, StopReason
from tandem.engine.layout import Prompts, decoded, eos_ids, finish, pad_id, padded
from tandem.engine.vllm_pair import ARCHITECTURE, BOARDS, QuietJuniorReload, register
from tandem.engine.vllm_pair import shape_mismatch as pair_mismatch
from tandem.engine.vllm_pens import KEY as PEN
from tandem.engine.vllm_pens import pen_processor, run_pens
from tandem.engine.vllm_turns import KEY, Row, run_turns, sampled, turn_processor
from tandem.registry import BACKENDS
from tandem.samplers.base import Sampler

log = logging.getLogger(__name__)


ENGINES = ("auto", "pair", "turns")


@BACKENDS.register("vllm")
class VLLMBackend:
    """Senior (and junior) vLLM engines in this process.

    Args:
        senior: the senior's model folder (or hub name, or ``tiny``).
        junior: the junior's; ``None`` for solo only; the senior's folder shares its engine
            until the first ``load_weights``.
        tokenizer: decodes ``Rollouts.texts`` and supplies the pad id.
        dtype: the engines' dtype (float32 to match the torch engine's log-probs).
        seed: the engines' seed (each request also gets its own seed from ``params.seed``).
        max_model_len: the longest prompt + response (None: the model's own limit).
        kv_cache_gib: KV cache per engine on CPU (``VLLM_CPU_KVCACHE_SPACE``).
        sync_every: ``sync`` loads the senior's weights every this many training steps
            (batches of rollouts).
        engine: ``"pair"`` (both models in one engine, ``tandem.engine.vllm_pair``),
            ``"turns"`` (two engines, in turns) or ``"auto"`` (the pair where the two models'
            configs agree on their shapes, else turns, saying why).
        engine_args: more ``vllm.LLM`` arguments (e.g. ``gpu_memory_utilization``).
    """

    #: the tandem engine built: "pair", "turns", or None (no junior)
    engine: str | None = None

    def __init__(
        self,
        senior: str,
        junior: str | None = None,
        tokenizer: Any = None,
        *,
        dtype: str = "float32",
        seed: int = 0,
        max_model_len: int | None = None,
        kv_cache_gib: float = 1.0,
        sync_every: int = 1,
        engine: str = "auto",
        engine_args: dict[str, Any] | None = None,
    ) -> None:
        if sync_every < 1:
            raise ValueError(f"sync_every ({sync_every}) must be >= 1 training step.")
        if engine not in ENGINES:
            raise ValueError(
                f"engine ({engine!r}) must be one of {ENGINES}: 'pair' runs senior and junior in "
                "one vLLM engine, 'turns' in two, 'auto' picks the pair where it can."
            )
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gib))))
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
            raise RuntimeError(
                "VLLM_ENABLE_V1_MULTIPROCESSING is not 0: the backend loads new weights into the "
                "engine in-process and its logits processor reads tables from this process. "
                "Unset it or set it to 0."
            )
        self.paths = (resolve(senior), None if junior is None else resolve(junior))
        self.tokenizer = tokenizer if tokenizer is not None else _tokenizer(self.paths[0])
        self.sync_every, self.weights_step = sync_every, -1
        self.resumed = 0  # pair requests vLLM preempted and took back, in the last batch
        self.args = dict(
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enable_prefix_caching=True,
            logits_processors=[turn_processor()],
            # no chunked prefill: a seeded request whose prompt is split has its sample
            # discarded, and vLLM 0.32 then rewinds its generator, which CPU generators refuse
            **({"enforce_eager": True, "enable_chunked_prefill": False} | (engine_args or {})),
        )
        self.configs = _configs(self.paths[0])  # where the senior names its EOS ids
        self.engine = None if junior is None else self._which(engine)
        if self.engine == "pair":
            self.senior = self.junior = self._pair()
        else:
            self.senior = self._engine(self.paths[0])
            same = self.paths[1] == self.paths[0]
            self.junior = self.senior if same else self._engine(self.paths[1]) if junior else None
        self.vocab = self.senior.llm_engine.model_config.get_vocab_size()

    @classmethod
    def from_models(cls, senior: Any, junior: Any | None, tokenizer: Any, **options: Any):
        """Engines for Hugging Face models, from the folders they were loaded from."""
        paths = [None if m is None else getattr(m, "name_or_path", None) for m in (senior, junior)]
        if not paths[0] or (junior is not None and not paths[1]):
            raise ValueError(
                "the vLLM backend starts its engines from model folders, but a model has no "
                "name_or_path. Load it with from_pretrained, or use backend=torch."
            )
        return cls(paths[0], paths[1], tokenizer, **options)

    def _engine(self, path: str) -> Any:
        from vllm import LLM

        return LLM(model=path, **self.args)

    def _which(self, engine: str) -> str:
        """``pair`` or ``turns``: ``engine``, checked against the two models' configs."""
        mismatch = pair_mismatch(self.configs[-1].to_dict(), _configs(self.paths[1])[-1].to_dict())
        if engine == "pair" and mismatch:
            raise ValueError(
                f"engine='pair' needs a senior and a junior of one shape, but their configs "
                f"differ in {mismatch}. Use engine='turns' (two engines) or engine='auto'."
            )
        if engine == "auto" and mismatch:
            log.info("vllm: two engines in turns, as the models differ in %s", mismatch)
            return "turns"
        return "pair" if engine == "auto" else engine

    def _pair(self) -> Any:
        """One engine holding both models (``tandem.engine.vllm_pair``)."""
        from vllm import LLM

        register()
        self.board_key = f"{id(self)}"
        overrides = {
            "architectures": [ARCHITECTURE],
            "tandem_architecture": self.configs[-1].architectures[0],
            "tandem_junior": self.paths[1],
            "tandem_board": self.board_key,
        }
        args = self.args | {"logits_processors": [pen_processor()], "async_scheduling": False}
        return LLM(model=self.paths[0], hf_overrides=overrides, **args)

    # -- weights -----------------------------------------------------------------------------
    def load_weights(self, weights: Weights, step: int) -> None:
        """Load the senior's new weights (HF names) into the running senior engine."""
        if self.junior is self.senior and self.engine != "pair":
            self.junior = self._engine(self.paths[1])  # the junior stays at the starting weights
        items = weights.items() if hasattr(weights, "items") else weights
        stream = ((name, full_tensor(t.detach())) for name, t in items)
        # the pair's junior layers are left alone by design; a plain engine's warnings stay
        quiet = QuietJuniorReload() if self.engine == "pair" else None
        layerwise = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        if quiet is not None:
            layerwise.addFilter(quiet)
        try:
            self.senior.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": stream, "is_checkpoint_format": True}
            )
        finally:
            if quiet is not None:
                layerwise.removeFilter(quiet)
        self.senior.reset_prefix_cache()  # cached KV was computed by the old weights
        self.weights_step = step

    def sync(self, senior: Any, step: int) -> None:
        """Load ``senior``'s weights when ``sync_every`` steps have passed (or never loaded).

        A sharded senior's parameters are gathered one tensor at a time as vLLM reads them (so
        every rank must sync at the same step, as the trainer does)."""
        if self.weights_step < 0 or step - self.weights_step >= self.sync_every:
            self.load_weights(senior.state_dict(), step)

    # -- generation --------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Sequence[int]] | Sequence[Tensor],
        sampler: Sampler | None = None,
        params: SamplingParams | None = None,
        *,
        junior: bool | None = None,
    ) -> Rollouts:
        """Rollouts as the torch engine's ``generate`` gives them (see ``tandem.engine.base``).

        Args:
            prompts: prompt token ids, one sequence per prompt.
            sampler: who authors; ``None`` or solo: the senior alone.
            params: sampling parameters.
            junior: whether the junior's log-probs are recorded (None: when it writes).
        """
        params = params if params is not None else SamplingParams()
        solo = sampler is None or getattr(sampler, "solo", False)
        reads = junior if junior is not None else not solo
        if (reads or not solo) and self.junior is None:
            raise ValueError(
                f"{sampler!r} needs the junior, but this backend was built without one. "
                "Pass junior=<its folder>, or use the solo sampler."
            )
        eos = eos_ids(params.eos_token_ids, self.configs)
        g = params.samples_per_prompt
        batch = Prompts.of(prompts, pad_id(eos, (self.tokenizer,)))
        width = batch.ids.shape[1]
        rows = [
            Row(ids[width - k :].tolist(), k)
            for ids, k in zip(batch.ids, batch.lengths.tolist(), strict=True)
            for _ in range(g)
        ]
        log.info(
            "vllm: %d rows, senior weights of step %d%s",
            len(rows),
            self.weights_step,
            "" if solo else f", tandem with {sampler!r}",
        )
        # the id forced where a schedule ends (a turn, a cap on turns), cut from the rows
        stop = eos[0] if eos else int(self.tokenizer.pad_token_id or 0)
        if not solo:
            tables = sampler.tables
            sampler.bind(self.vocab if tables is None else max(self.vocab, tables.size), "cpu")
        if self.engine == "pair":
            junior_lps = self._pair_generate(rows, None if solo else sampler, params, eos, stop)
            return self._rollouts(rows, batch, g, eos, None, junior_lps if reads else None)
        if solo:
            self._solo(rows, params, eos)
        else:
            run_turns(self, rows, sampler, params, eos, stop)
        junior_lps = self._forced(self.junior, rows, JUNIOR) if reads else None
        senior_lps = self._forced(self.senior, rows, SENIOR) if not solo else None
        return self._rollouts(rows, batch, g, eos, senior_lps, junior_lps)

    def _pair_generate(self, rows: list[Row], sampler: Sampler | None, params, eos, stop: int):
        """Every row in one ``generate`` call of the pair engine; fills ``rows`` with their
        tokens, authors and senior log-probs, and returns the junior's log-probs."""
        pens = run_pens(
            lambda sampling: self._run(self.senior, rows, sampling),
            lambda i, key: self._request(rows[i], i, params, eos, key, stop, extra=PEN),
            BOARDS[self.board_key],
            rows,
            sampler,
            params,
            stop,
        )
        self.resumed = pens.resumed
        junior = []
        for i, row in enumerate(rows):
            junior.append([])
            for token, author, senior_lp, junior_lp in pens.written[i][: pens.cut[i]]:
                junior[-1].append(junior_lp)
                if self._emit(row, token, senior_lp, author, params, eos):
                    break
            if row.stop is None:
                row.stop = StopReason.LENGTH  # the schedule's own end: a cap on turns
        return junior

    def _request(
        self, row: Row, index: int, params: SamplingParams, eos, key=None, stop=None, extra=KEY
    ) -> Any:
        from vllm import SamplingParams as VSamplingParams

        row.requests += 1
        # params.kv_cache_gib is the torch engine's: vLLM sizes its own cache (engine_args'
        # gpu_memory_utilization; on CPU, this backend's own kv_cache_gib), so it is not read
        return VSamplingParams(
            n=1,
            max_tokens=params.budget(row.prompt_length) - len(row.tokens),
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=_mix(params.seed, index, row.requests),
            logprobs=None if extra == PEN else 0,  # the pen records both models' own
            stop_token_ids=list(eos) + ([stop] if key is not None else []),
            ignore_eos=True,  # the stop ids above are the only EOS, as in the torch engine
            detokenize=False,
            extra_args=None if key is None else {extra: key},
        )

    def _run(self, engine: Any, rows: list[Row], sampling: list[Any]) -> list[Any]:
        prompts = [{"prompt_token_ids": r.context} for r in rows]
        return [o.outputs[0] for o in engine.generate(prompts, sampling, use_tqdm=False)]

    def _solo(self, rows: list[Row], params: SamplingParams, eos: tuple[int, ...]) -> None:
        sampling = [self._request(r, i, params, eos) for i, r in enumerate(rows)]
        for row, out in zip(rows, self._run(self.senior, rows, sampling), strict=True):
            for token, lp in zip(out.token_ids, sampled(out), strict=True):
                if self._emit(row, token, lp, SENIOR, params, eos):
                    break

    def _emit(self, row: Row, token: int, lp: float, author: int, params, eos) -> bool:
        """Append one token; True when the row is finished."""
        row.tokens.append(token)
        row.authors.append(author)
        row.logprobs.append(lp)
        row.context.append(token)
        if token in eos:
            row.stop = StopReason.EOS
        elif len(row.tokens) >= params.budget(row.prompt_length):
            row.stop = StopReason.LENGTH
        return row.stop is not None

    def _forced(self, engine: Any, rows: list[Row], code: int) -> list[list[float]]:
        """Each response token's raw log-prob under ``engine``'s model (teacher-forced where
        another model wrote it, the sampled value where this one did)."""
        from vllm import SamplingParams as VSamplingParams

        todo = [i for i, r in enumerate(rows) if any(a != code for a in r.authors)]
        out = [list(r.logprobs) for r in rows]
        if todo:
            sampling = VSamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
            prompts = [{"prompt_token_ids": rows[i].context} for i in todo]
            for i, o in zip(todo, engine.generate(prompts, sampling, use_tqdm=False), strict=True):
                row, forced = rows[i], o.prompt_logprobs
                for t, (token, a) in enumerate(zip(row.tokens, row.authors, strict=True)):
                    if a != code:
                        out[i][t] = forced[row.prompt_length + t][token].logprob
        return out

    def _rollouts(self, rows, batch: Prompts, g: int, eos, senior_lps, junior_lps) -> Rollouts:
        pad = pad_id(eos, (self.tokenizer,))
        tokens = padded([r.tokens for r in rows], pad, torch.long)  # [N, T]
        lengths = torch.tensor([len(r.tokens) for r in rows])  # [N]
        senior = [r.logprobs for r in rows] if senior_lps is None else senior_lps
        return finish(
            Rollouts,
            tokens=tokens,
            authors=padded([r.authors for r in rows], PAD, torch.long),  # [N, T]
            senior_logprobs=padded(senior, 0.0, torch.float32),  # [N, T]
            junior_logprobs=None if junior_lps is None else padded(junior_lps, 0.0, torch.float32),
            lengths=lengths,
            stop_reasons=torch.tensor([int(r.stop) for r in rows]),
            **batch.rows(g),
            pad_token_id=pad,
            texts=decoded(self.tokenizer, tokens, lengths),
        )


def _mix(seed: int, row: int, request: int) -> int:
    """A request's seed from (params.seed, row, request count): reruns repeat it."""
    return (seed * 1_000_003 + row * 7_919 + request * 104_729) % (2**31 - 1)


def _tokenizer(path: str) -> Any:
    """The model folder's tokenizer, padding with EOS where it names no pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _configs(path: str) -> list[Any]:
    """A model folder's generation config (where it has one) and config: where it names its
    EOS ids, read in that order as the torch engine reads them."""
    from transformers import AutoConfig, GenerationConfig

    sources = []
    if Path(path, "generation_config.json").is_file():
        sources.append(GenerationConfig.from_pretrained(path))
    return [*sources, AutoConfig.from_pretrained(path)]


def full_tensor(t: Tensor) -> Tensor:
    """``t`` whole: a ``DTensor`` shard (an FSDP2 senior's parameter) is all-gathered, a
    collective every rank of its mesh must join; any other tensor is itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t
