"""One rank of a job `torchrun` would start (`allocbench capture --nproc-per-node`): PyTorch's
fake process group answers `init_process_group`, and what the rank's NCCL communicators would be
is noted for the trace's closing lines; a rank's role (for `--ranks distinct`) is its
allocations' fingerprint and its communicators."""
from __future__ import annotations

import os

# Set by `allocbench capture --nproc-per-node` for each rank it runs (with torchrun's variables).
RANK_FLAG = "ALLOCBENCH_RANK"
# `--ranks distinct`: the roles of the ranks captured before this one, FINGERPRINT=RANK,...
KNOWN_ROLES = "ALLOCBENCH_KNOWN_ROLES"


def _uniform_ranks_options(torch):
    """FakeProcessGroup's options with simulate_uniform_ranks, where the torch in use has it."""
    from torch.testing._internal.distributed.fake_pg import FakeProcessGroup

    options_of = getattr(FakeProcessGroup, "Options", None)
    if options_of is None or not hasattr(options_of(), "simulate_uniform_ranks"):
        return None
    options = options_of()
    options.simulate_uniform_ranks = True
    return options


def install_fake_process_group(torch, set_attr):
    """One rank of a multi-process job (`--nproc-per-node`): init_process_group, whatever backend
    the script asks for (nccl, gloo), is PyTorch's fake process group (torch.testing._internal.
    distributed.fake_pg: collectives return at once with outputs of the right shapes, no peers)
    with the rank and world size torchrun's variables give. `set_attr(owner, name, value)`
    replaces an attribute until the capture ends."""
    distributed = torch.distributed
    if not os.environ.get(RANK_FLAG) or not distributed.is_available():
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore

    original = distributed.init_process_group

    def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None, *args, **kwargs):
        kwargs.pop("device_id", None)  # (binds NCCL's communicator to a device: the fake has none)
        # Every rank holds what this one holds (uniform SPMD): a collective's work then carries
        # its outputs, which DDP's reducer reads from the all-reduce's future.
        options = _uniform_ranks_options(torch)
        return original("fake", store=FakeStore(), world_size=int(os.environ["WORLD_SIZE"]), rank=int(os.environ["RANK"]),
                        **({"pg_options": options} if options is not None else {}),
                        **({"timeout": timeout} if timeout is not None else {}))

    set_attr(distributed, "init_process_group", init_process_group)
    _note_point_to_point(distributed, set_attr)
    destroy = distributed.destroy_process_group

    def destroy_process_group(*args, **kwargs):
        note_groups(torch)
        return destroy(*args, **kwargs)

    set_attr(distributed, "destroy_process_group", destroy_process_group)


# Calls that connect a rank to peers of its group beyond its ring's two neighbours: all-to-all
# to every member, send/recv to the rank named. Their groups -> the peers' global ranks (or ALL).
_POINT_TO_POINT = {"all_to_all_single", "all_to_all", "send", "recv", "isend", "irecv", "batch_isend_irecv"}
_ALL = "all"
_peers_of_group = {}


def _note_point_to_point(distributed, set_attr):
    import inspect

    def noting(owner, name):
        original = getattr(owner, name, None)
        if original is None:
            return
        signature = inspect.signature(original)

        def called(*args, **kwargs):
            try:
                bound = signature.bind_partial(*args, **kwargs).arguments
            except TypeError:
                bound = {}
            pairs = [(bound.get("group"), _ALL if "all_to_all" in name else bound.get("dst", bound.get("src")))]
            if name == "batch_isend_irecv":
                pairs = [(op.group, op.peer) for op in (bound.get("p2p_op_list") or [])]
            for group, peer in pairs:
                peers = _peers_of_group.setdefault(id(group if group is not None else distributed.group.WORLD), set())
                if peer is not None:
                    peers.add(peer)
            return original(*args, **kwargs)

        set_attr(owner, name, called)

    for name in _POINT_TO_POINT:
        noting(distributed, name)
    import torch.distributed._functional_collectives as funcol

    noting(funcol, "all_to_all_single")


_groups = {}  # id(process group) -> its size, for the groups of more than one rank this rank is in


def note_groups(torch):
    """Remembers the process groups that exist now (at each step and before a group is destroyed:
    a script may destroy them before the capture ends)."""
    distributed = torch.distributed
    if not os.environ.get(RANK_FLAG) or not distributed.is_available() or not distributed.is_initialized():
        return
    rank = distributed.get_rank()
    for group, ranks in list(distributed.distributed_c10d._world.pg_group_ranks.items()):
        if rank in ranks and len(ranks) > 1:
            _groups[id(group)] = len(ranks)


def role_of(fingerprint, torch):
    """A rank's role: its allocations' fingerprint and its communicators (their peers set its
    NCCL buffers)."""
    import zlib

    return f"{fingerprint}-{zlib.crc32(chr(10).join(communicators(torch)).encode()):08x}"


def communicators(torch):
    """The comment lines naming this rank's NCCL communicators: one per process group of more
    than one rank it is a member of (NCCL makes one when the group first communicates; an
    upper count), with the peers it reached by all-to-all or send/recv, and the NCCL settings
    of the environment. allocbench sizes their buffers from them (src/results/common.rs, NcclBudget)."""
    note_groups(torch)
    def p2p_peers(group, size):
        peers = _peers_of_group.get(group, ())
        return size - 1 if _ALL in peers else len(peers)

    lines = [f"nccl communicator: ranks={size} p2p_peers={p2p_peers(group, size)}" for group, size in _groups.items()]
    settings = [f"{k}={os.environ[k]}" for k in ("NCCL_BUFFSIZE", "NCCL_LL128_BUFFSIZE", "NCCL_LL_BUFFSIZE", "NCCL_MAX_NCHANNELS") if os.environ.get(k)]
    if lines and settings:
        lines.append("nccl settings: " + " ".join(settings))
    return lines
