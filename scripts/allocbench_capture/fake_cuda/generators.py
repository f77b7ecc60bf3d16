"""CUDA generators on fake CUDA: torch.Generator(device="cuda") and torch.cuda's RNG functions,
with CUDA's Philox state (the draws themselves happen on the CPU)."""
from __future__ import annotations

from ..errors import _NO_SUCH_DEVICE, _NO_SUCH_DEVICE_FIX, NeedsDriver

# A new generator's seed (default_rng_seed_val in c10/core/GeneratorImpl.h), CUDA's included.
_DEFAULT_RNG_SEED = 67280421310721


def _fake_cuda_generators(torch, patches):
    """torch.Generator(device="cuda") and torch.cuda's RNG state functions on fake CUDA."""
    cuda = torch.cuda
    real_generator = torch.Generator

    class Generator(real_generator):
        """A CUDA generator draws on the CPU (fake CUDA ops take one); it still says it is CUDA's,
        and its state is CUDA's: the Philox seed and offset, 16 bytes (CUDAGeneratorImpl::get_state
        in aten/src/ATen/cuda/CUDAGeneratorImpl.cpp), not the CPU's Mersenne Twister (5,056).
        The offset moves only when set: no kernel draws on fake CUDA."""

        def __new__(cls, device="cpu"):
            generator = super().__new__(cls, "cpu")
            generator.wanted = torch.device(device)
            if generator.wanted.type == "cuda" and generator.wanted.index is None:
                generator.wanted = torch.device("cuda", 0)
            generator.philox = [_DEFAULT_RNG_SEED, 0]  # (seed, offset), as a new CUDAGeneratorImpl
            return generator

        def __init__(self, device="cpu"):
            pass

        @property
        def device(self):
            return self.wanted

        def _cuda(self):
            return self.wanted.type == "cuda"

        def get_state(self):
            if not self._cuda():
                return super().get_state()
            seed, offset = self.philox
            return torch.frombuffer(bytearray(seed.to_bytes(8, "little") + offset.to_bytes(8, "little", signed=True)), dtype=torch.uint8)

        def set_state(self, new_state):
            if not self._cuda():
                return super().set_state(new_state)
            if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8 or new_state.device.type != "cpu":
                raise TypeError("RNG state must be a torch.ByteTensor")
            data = bytes(new_state.contiguous().tolist())
            if len(data) not in (8, 16):  # (8: a seed alone, offset 0)
                raise RuntimeError("RNG state is wrong size")
            offset = int.from_bytes(data[8:] or bytes(8), "little", signed=True)
            if offset % 4:
                raise RuntimeError("offset must be a multiple of 4")
            self.philox = [int.from_bytes(data[:8], "little"), offset]
            return self

        def manual_seed(self, seed):
            super().manual_seed(seed)
            if self._cuda():
                self.philox = [int(seed) & 0xFFFF_FFFF_FFFF_FFFF, 0]
            return self

        def seed(self):
            seed = super().seed()
            if self._cuda():
                self.philox = [seed, 0]
            return seed

        def initial_seed(self):
            return self.philox[0] if self._cuda() else super().initial_seed()

        def get_offset(self):
            return self.philox[1] if self._cuda() else super().get_offset()

        def set_offset(self, offset):
            if not self._cuda():
                return super().set_offset(offset)
            self.philox[1] = int(offset)
            return self

    patches.set(torch, "Generator", Generator)
    # torch.cuda's default generator (one device), its module functions going through it as
    # torch/cuda/random.py's do; torch.manual_seed and torch.seed reach it by manual_seed_all.
    default = Generator("cuda")
    # (seeded at random, as getDefaultCUDAGenerator seeds it: the CPU's seed, which is so too)
    default.manual_seed(torch.initial_seed())
    patches.set(cuda, "default_generators", (default,))

    def default_of(device="cuda"):
        index = torch.cuda._utils._get_device_index(device, optional=True) if not isinstance(device, int) else device
        if index not in (0, -1):
            raise NeedsDriver(_NO_SUCH_DEVICE.format(device=f"cuda:{index}"), fix=_NO_SUCH_DEVICE_FIX)
        return default

    def set_states(states):
        for state in states[:1]:
            default.set_state(state)

    def set_rng_state(new_state, device="cuda"):
        default_of(device).set_state(new_state)

    def reseed(seed=None):
        # (torch.cuda's seeding functions answer None)
        if seed is None:
            default.seed()
        else:
            default.manual_seed(int(seed))

    rng = dict(
        get_rng_state=lambda device="cuda": default_of(device).get_state(),
        set_rng_state=set_rng_state,
        get_rng_state_all=lambda: [default.get_state()],
        set_rng_state_all=set_states,
        manual_seed=reseed,
        manual_seed_all=reseed,
        seed=lambda: reseed(),
        seed_all=lambda: reseed(),
        initial_seed=lambda: default.initial_seed(),
    )
    for module in (cuda, cuda.random):
        for name, fn in rng.items():
            if hasattr(module, name):
                patches.set(module, name, fn)

