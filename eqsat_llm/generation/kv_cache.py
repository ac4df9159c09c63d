"""The step program a Generator compiles: a transformers causal LM over a static KV cache that
the module owns as buffers, so that torch.export sees the cache as state written in place.

    step = CachedStep(model, batch_size=1, max_seq_len=256)
    logits = step(input_ids, past, position_ids, attention_mask, last)

One call runs `T = input_ids.shape[1]` new tokens (T = 1: a decode step; T > 1: a chunk of the
prompt) at cache positions past .. past + T - 1, where `past` is a 0-d run-time tensor: one
program serves every position. Each layer writes its new keys and values into its buffers with
`index_copy_` (state.write_state_in_place makes that an in-place write on the buffer) and
attends over the whole buffer under the model's own mask, built from the run-time
`attention_mask` [batch, max_seq_len] (1 where a key holds a real token) and the causal
position; keys past the valid prefix are -inf for every row, which the attention kernel skips
at run time. `last` [1] picks the position whose logits are returned (transformers'
`logits_to_keep` as an index), so the LM head runs for one row per sequence, not T.

The cache holds the model's KV heads (grouped-query attention keeps its smaller cache), in
`dtype`: the model's, or float32 for a half-precision model compiled to C (which computes in
float32: a half cache would be widened on every call)."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch import nn

from ..capture.moe_forms import experts_for_capture
from ..errors import EqsatError


@functools.cache
def _static_layer_class() -> type:
    from transformers.cache_utils import StaticLayer

    class BufferLayer(StaticLayer):
        """A static cache layer on given buffers, written at positions `past + arange(T)`
        (the run-time `cumulative_length`), without advancing it: the caller owns the
        position, so the same program serves every step. Its update reads and writes nothing
        but STAMP_STATE, the constructor's arguments: a layer calling it can be traced once
        for all layers (capture/stamping.py)."""

        STAMP_STATE = ("keys", "values", "cumulative_length")

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, past: torch.Tensor):
            super().__init__(keys.shape[-2])
            self.keys, self.values, self.cumulative_length = keys, values, past
            self.batch_size, self.num_heads = keys.shape[:2]
            self.k_head_dim, self.v_head_dim = keys.shape[-1], values.shape[-1]
            self.device, self.is_initialized = keys.device, True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            pos = torch.arange(key_states.shape[-2], device=self.device) + self.cumulative_length
            self.keys.index_copy_(2, pos, key_states.to(self.keys.dtype))
            self.values.index_copy_(2, pos, value_states.to(self.values.dtype))
            if key_states.dtype == self.keys.dtype:
                return self.keys, self.values
            # a cache wider than the model (formats/half.py: the C backend computes a half model in
            # float32, where these conversions vanish) is read in the model's dtype
            return self.keys.to(key_states.dtype), self.values.to(value_states.dtype)

    return BufferLayer


def text_config(model: nn.Module) -> Any:
    config = getattr(model, "config", None)
    if config is None:
        raise EqsatError(f"{type(model).__name__} has no `config`: a Generator needs a "
                         "transformers causal LM (or a module with its call convention)")
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def cached_shapes(model: nn.Module, cache_arg: str) -> list[tuple[int, int, int]]:
    """(heads, key dim, value dim) the model caches per layer, read from one eager call on a
    DynamicCache: what each family stores (KV heads under grouped-query attention; Falcon's
    new architecture stores its repeated heads), whatever its config calls them."""
    from transformers.cache_utils import DynamicCache

    config = text_config(model)
    cache = DynamicCache(config=config)
    with torch.no_grad(), experts_for_capture(model):
        model(input_ids=torch.zeros(1, 1, dtype=torch.long), use_cache=True,
              **{cache_arg: cache})
    shapes = [(layer.keys.shape[1], layer.keys.shape[-1], layer.values.shape[-1])
              for layer in cache.layers if getattr(layer, "keys", None) is not None]
    if not shapes:
        raise EqsatError(f"{type(model).__name__} wrote nothing into its cache; a Generator "
                         "needs a causal LM that caches keys and values")
    return shapes


class CachedStep(nn.Module):
    """`forward(input_ids [B, T], past [], position_ids [B, T], attention_mask [B, L],
    last [1])` -> logits [B, 1, vocab] at position `last` of the T new tokens."""

    def __init__(self, model: nn.Module, batch_size: int, max_seq_len: int,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        self.model = model
        config = text_config(model)
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        if self._cache_arg not in params or "logits_to_keep" not in params:
            raise EqsatError(f"{type(model).__name__}.forward takes no `past_key_values`/"
                             "`cache` and `logits_to_keep`: a Generator needs a transformers "
                             "causal LM (or a module with its call convention)")
        self._config = config
        shapes = cached_shapes(model, self._cache_arg)
        self.layers = len(shapes)
        for i, (heads, k_dim, v_dim) in enumerate(shapes):
            for kind, dim in (("keys", k_dim), ("values", v_dim)):
                self.register_buffer(f"{kind}_{i}", torch.zeros(
                    batch_size, heads, max_seq_len, dim, dtype=dtype), persistent=False)

    def caches(self) -> list[torch.Tensor]:
        return [getattr(self, name) for name in self.cache_names()]

    def cache_names(self) -> list[str]:
        return [f"{kind}_{i}" for i in range(self.layers) for kind in ("keys", "values")]

    def forward(self, input_ids: torch.Tensor, past: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        from transformers.cache_utils import StaticCache

        layer_cls = _static_layer_class()
        max_len = self.keys_0.shape[-2]
        cache = StaticCache(max_cache_len=max_len, config=self._config)
        cache.layers = [layer_cls(getattr(self, f"keys_{i}"), getattr(self, f"values_{i}"),
                                  past) for i in range(self.layers)]
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, use_cache=True, logits_to_keep=last,
                         **{self._cache_arg: cache})
        return out.logits


class CacheBuffers:
    """A Generator's KV cache without its model (a start from warm_start.StartRecord): the
    buffers CachedStep would hold, by name, on the meta device until the Generator makes
    them."""

    def __init__(self, specs: list[tuple[str, tuple[int, ...], torch.dtype]]):
        self._names = [name for name, _, _ in specs]
        for name, shape, dtype in specs:
            setattr(self, name, torch.empty(shape, dtype=dtype, device="meta"))

    def caches(self) -> list[torch.Tensor]:
        return [getattr(self, name) for name in self._names]

    def cache_names(self) -> list[str]:
        return list(self._names)
