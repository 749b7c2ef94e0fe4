"""The hf inference backend: transformers models sampled by `models/sampling.py`, adopted by reloading each full
version (`load_policy`) and, for LoRA versions, by copying only the adapter tensors into the held model
(`lora.Adopting`)."""

from __future__ import annotations

import functools

from prime_values.weights import Adopter


class HFBackend:
    def __init__(self, policy_root, device: str = "cpu", attention=None):
        """`attention`: the worker's models.build.Attention (None: the default, sdpa in float32)."""
        from prime_values.models import load_policy, lora
        from prime_values.models.build import DEFAULT_ATTENTION

        load = functools.partial(load_policy, attention=attention or DEFAULT_ATTENTION)
        self.policy = Adopter(policy_root, lora.Adopting(load, device)) if policy_root is not None else None

    @classmethod
    def holding(cls, model) -> "HFBackend":
        """A backend around a model already in hand (no versions to follow)."""
        backend = cls(None)
        backend._model = model
        return backend

    @property
    def model(self):
        return self.policy.value if self.policy is not None else self._model

    def sample(self, prompt_ids, num_samples: int, max_new_tokens: int, temperature: float, eos_id: int,
               pad_id: int, seed: int, batch_size: int | None = None):
        from prime_values.models.sampling import sample

        return sample(self.model, prompt_ids, num_samples=num_samples, max_new_tokens=max_new_tokens,
                      temperature=temperature, eos_id=eos_id, pad_id=pad_id, seed=seed, batch_size=batch_size)

    def close(self) -> None:
        pass
