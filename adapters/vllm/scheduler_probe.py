"""vLLM 0.33.0's own v1 `Scheduler`, built and stepped on a CPU-only machine, no model.

A probe, not an adapter: it shows that the real scheduler (admission, chunked prefill,
preemption, stops, aborts, prefix hits) can run over the same hybrid block pool the
`vllm` adapters drive through `KVCacheManager` alone (engine.py), with the caller
playing the model runner: it chooses every sampled token. The scheduler-tier adapter
(scheduler.py) builds its scheduler with `build_scheduler`.

How the scheduler is built without a model:

* `ModelConfig` reads a Hugging Face `config.json` from a local folder this module
  writes (a tiny Llama shape); no weights, no tokenizer (`skip_tokenizer_init`),
  nothing is downloaded (`HF_HUB_OFFLINE=1` is set if unset). Its architecture is a
  stand-in class registered with vLLM's `ModelRegistry` and never instantiated: with a
  real one (`LlamaForCausalLM`) vLLM inspects the model module in a subprocess the
  first time (~17 s here, then cached under `VLLM_CACHE_ROOT/modelinfos`).
* `DeviceConfig(device="cpu")`: with no CUDA and no CPU build of vLLM, the platform is
  "unspecified" and `VllmConfig` cannot infer a device by itself.
* `SchedulerConfig(async_scheduling=False)`: vLLM would otherwise pick async
  scheduling, which `Scheduler` (the synchronous class used here) does not model.
* The `KVCacheConfig` is written by hand, as the engine's memory planner would: a
  full-attention group, a sliding-window group (vLLM's `sliding_window` is kvspec's
  window plus one: vLLM counts the current token in it), and optionally a Mamba group
  in "align" mode, all with the page size as block size, over one pool of `num_blocks`
  blocks (block 0 is vLLM's null block, so `num_blocks - 1` are usable).
  `cache_config.num_gpu_blocks` is set, as `EngineCore` does after profiling.

What to read on a running scheduler `s` (kv = `s.kv_cache_manager`):

* block tables: `kv.get_block_ids(rid)` (one list of block ids per group, in
  `s.kv_cache_config.kv_cache_groups` order; 0 is the null block), or the blocks
  themselves, `kv.coordinator.single_type_managers[g].req_to_blocks[rid]`;
* free blocks: `kv.block_pool.get_num_free_blocks()`; the prefix-cache map:
  `kv.block_pool.cached_block_hash_to_block`;
* preemptions: `scheduler_output.preempted_req_ids` of the step, `request.num_preemptions`,
  `request.status` (`RequestStatus.PREEMPTED` while waiting again);
* prefix hits: at admission, `NewRequestData.num_computed_tokens` in
  `scheduler_output.scheduled_new_reqs` (the hit, in tokens). A preempted request
  comes back there too, not in `scheduled_cached_reqs.resumed_req_ids`: vLLM picks its
  V2 model runner (`VLLM_USE_V2_MODEL_RUNNER` unset, Triton importable), for which the
  scheduler sends a resumed request as a new one. Per step,
  `engine_core_outputs[0].scheduler_stats.prefix_cache_stats` (`requests`, `queries`,
  `hits`, `preempted_*`). `kv.prefix_cache_stats` is the running tally, but every
  `update_from_output` hands it over in those stats and starts a new one.
"""

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from functools import cache

FILLER_TOKEN = 0
"""What `step` samples for a request the caller gave no token for."""

VOCAB = 1 << 16
ARCHITECTURE = "KvspecProbeForCausalLM"


@cache
def _register_architecture() -> None:
    """Register a stand-in text-generation model class: vLLM reads its interfaces
    (a generative, attention-only model) from the class itself, in this process."""
    from torch import nn
    from vllm import ModelRegistry

    class KvspecProbeForCausalLM(nn.Module):
        """Never built: the scheduler needs no model, only what the config says of it."""

        def __init__(self, *, vllm_config, prefix: str = ""):
            raise NotImplementedError("the scheduler probe runs no model")

        def embed_input_ids(self, input_ids):
            raise NotImplementedError

        def forward(self, input_ids, positions):
            raise NotImplementedError

        def compute_logits(self, hidden_states):
            raise NotImplementedError

    ModelRegistry.register_model(ARCHITECTURE, KvspecProbeForCausalLM)


@cache
def _model_dir() -> str:
    """A folder holding only a tiny Llama-shaped `config.json`: all `ModelConfig` needs.
    One folder per user and content (not one per process: every worker of a check
    builds schedulers), written by a rename so that processes racing to write it agree."""
    config = {"architectures": [ARCHITECTURE], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
              "num_hidden_layers": 2, "vocab_size": VOCAB, "max_position_embeddings": 1 << 20,
              "rms_norm_eps": 1e-5, "torch_dtype": "float16"}
    text = json.dumps(config, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    folder = os.path.join(tempfile.gettempdir(), f"kvspec-vllm-probe-{os.getuid()}-{digest}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "config.json")
    if not os.path.exists(path):
        fd, partial = tempfile.mkstemp(dir=folder, suffix=".json")
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.replace(partial, path)
    return folder


def build_scheduler(page_size: int, window: int, num_blocks: int, max_num_batched_tokens: int,
                    max_num_seqs: int, *, mamba: bool = False, max_model_len: int | None = None,
                    groups: Sequence[str] = ("full", "swa"), retention: int | None | str = None,
                    kv_events: bool = False, log_stats: bool = True):
    """vLLM's real `Scheduler` over one pool of `num_blocks` blocks (block 0 the null
    block), with a full-attention and a sliding-window group (or the `groups` named,
    "full" or "swa" each, in that order; and a Mamba group in align mode if `mamba`),
    prefix caching and chunked prefill on.

    `retention`: the `KVCacheConfig`'s `prefix_cache_retention_interval`; None (its own
    default) caches every full block of a sliding-window group, "engine" takes
    `CacheConfig`'s, as vLLM's memory planner does (0: only the blocks a later hit at a
    prompt's end can use). `kv_events`: the manager emits KV events (`KVEventsConfig`,
    `publisher="null"`: the caller reads them)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import torch
    from vllm.config import CacheConfig, DeviceConfig, KVEventsConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash, resolve_kv_cache_block_sizes
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
        SlidingWindowSpec,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    if max_model_len is None:
        max_model_len = (num_blocks - 1) * page_size
    _register_architecture()
    model = ModelConfig(model=_model_dir(), skip_tokenizer_init=True, dtype="float16",
                        max_model_len=max_model_len)
    scheduler_config = SchedulerConfig(max_model_len=max_model_len, is_encoder_decoder=False,
                                       max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                       enable_chunked_prefill=True, async_scheduling=False)
    cache_config = CacheConfig(block_size=page_size, enable_prefix_caching=True,
                               mamba_cache_mode="align" if mamba else "none")
    events = KVEventsConfig(enable_kv_cache_events=True, publisher="null") if kv_events else None
    config = VllmConfig(model_config=model, scheduler_config=scheduler_config, cache_config=cache_config,
                        device_config=DeviceConfig(device="cpu"), kv_events_config=events)

    layer = {"num_kv_heads": 1, "head_size": 8, "dtype": torch.float16}
    specs = {"full": lambda: FullAttentionSpec(page_size, **layer),
             "swa": lambda: SlidingWindowSpec(page_size, **layer, sliding_window=window + 1)}
    kv_groups = [KVCacheGroupSpec([f"{kind}.{index}"], specs[kind]()) for index, kind in enumerate(groups)]
    if mamba:
        kv_groups.append(KVCacheGroupSpec(["mamba.0"], MambaSpec(
            block_size=page_size, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode="align")))
    if retention == "engine":
        retention = config.cache_config.prefix_cache_retention_interval
    kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=kv_groups,
                                    prefix_cache_retention_interval=retention)
    config.cache_config.num_gpu_blocks = num_blocks  # what EngineCore sets after profiling

    init_none_hash(sha256)  # the seed of the chained block hashes, before any Request
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, config)
    return Scheduler(vllm_config=config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(config),
                     block_size=block_size, hash_block_size=hash_block_size, log_stats=log_stats)


def make_request(scheduler, request_id: str, prompt: Iterable[int], max_tokens: int,
                 stop_token_ids: list[int] | None = None):
    """A `Request` the scheduler can take (`scheduler.add_request`): its block hasher
    hashes at the scheduler's hash block size; it stops at `max_tokens` output tokens or
    at a token of `stop_token_ids` (there is no EOS)."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    sampling = SamplingParams(max_tokens=max_tokens, stop_token_ids=stop_token_ids, ignore_eos=True)
    return Request(request_id=request_id, prompt_token_ids=list(prompt), sampling_params=sampling,
                   pooling_params=None, block_hasher=get_request_block_hasher(scheduler.hash_block_size, sha256))


def step(scheduler, sampled: dict[str, list[int]]):
    """One engine step: `schedule()`, then `update_from_output()` with what the caller's
    "model" sampled. Returns (scheduler_output, engine_core_outputs).

    A request samples this step when its scheduled tokens reach its end (a decode, or
    the last chunk of a prefill); it then gets `sampled[rid]`, or `[FILLER_TOKEN]` if the
    caller gave none. A request in the middle of its prefill samples nothing, as vLLM's
    model runner discards those tokens: what the caller gave for it, or for a request not
    scheduled, is not used (`engine_core_outputs` show what was)."""
    for rid, tokens in sampled.items():
        if len(tokens) > 1:  # checked before schedule(), so a refusal leaves the scheduler as it was
            raise ValueError(f"{rid}: one sampled token per step (no speculative decoding), got {tokens}")
    scheduler_output = scheduler.schedule()
    req_ids = list(scheduler_output.num_scheduled_tokens)
    tokens = []
    for rid in req_ids:
        request = scheduler.requests[rid]
        samples = request.num_computed_tokens >= request.num_tokens  # schedule() has added the step's tokens
        tokens.append(list(sampled.get(rid) or [FILLER_TOKEN]) if samples else [])
    return scheduler_output, scheduler.update_from_output(scheduler_output, runner_output(req_ids, tokens))


def runner_output(req_ids: list[str], sampled_token_ids: list[list[int]]):
    """The model runner's output of one step: a row per request, in `req_ids`' order. Up to
    0.33.0 it also carries each request's row (`req_id_to_index`); 0.34.0 derives the rows
    from `req_ids` and has no such field."""
    from vllm.v1.outputs import ModelRunnerOutput

    rows = {"req_id_to_index": {rid: i for i, rid in enumerate(req_ids)}} if carries_rows() else {}
    return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled_token_ids, **rows)


@cache
def carries_rows() -> bool:
    """Whether this release's ModelRunnerOutput has the field `req_id_to_index` (read once)."""
    from dataclasses import fields

    from vllm.v1.outputs import ModelRunnerOutput

    return "req_id_to_index" in {field.name for field in fields(ModelRunnerOutput)}
