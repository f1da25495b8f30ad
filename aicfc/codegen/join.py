"""One launch of two kernels: a K-major gemv joined to the kernel before it (passes/join_launches.py decides).

[Note: a gemv joined to the launch before it]
Where passes/join_launches.py joins gemv B (its schedule's JOIN = A, the blocks of the kernel before it) to
kernel H, H's launch runs both: blocks 0 .. A-1 run H's body, then publish (every thread's stores ordered by a
barrier, one fence, one atomic add on the pair's counter); blocks A .. A+B-1 run B's body as a role
(templates/gemm_gemv.cu.j2 under JOIN): its whole weight slice copied into the launch's shared memory by 16-byte
cp.async at once, the L2 fill, then the waits (the launch before complete, then the counter at A), then the
activations past L1 and the sums and epilogue as B's kernel has them; the last of B's blocks puts the counter back
to zero. The grid is rounded up to
H's cluster size with idle blocks. B's own record (its schedule and prediction) stays in the plan, launched as
part of H's: the bundle's `joined` list (artifact/payload.py).

Each role is a device function of the module, named after a hash of the two bodies' code (their comments dropped
and their kernels' names replaced), and the counter with them: two layers' joined launches whose code is the same
but for their names share one function ([Note: shared kernel code] in codegen/module.py) and its counter. That is
safe because a role's blocks read the counter only after their dependent-launch wait, when the launch before is
complete, and so (each kernel of a plan waiting for the one before it) every earlier launch of the same code,
whose last role block zeroed it.

All of the launch's blocks must be resident at once: B's blocks spin until every block of H has published, so
one of H's blocks waiting for an SM that B's blocks hold would never run. passes/join_launches.py asks that the
grid fit one wave at the launch's shared memory and registers (and a later launch cannot take an SM from a block
not yet dispatched: it starts only once every block of this one has let it, by its trigger or its exit).
"""
from __future__ import annotations

import hashlib
import re

from aicfc.errors import AicfError
from aicfc.ir.decision import Kernel

PLACEHOLDER = "aicf_join_role"   # the name B's body is rendered under before its hash is known
GATE = "aicf_join_gate"          # the counter as H's body names it when it counts its first tiles for B (JG)
_HEADER = re.compile(r'extern "C" __global__ void ((?:__\w+__\([^)]*\) )*)(\w+)\(([^)]*)\) \{')
_ROLE = re.compile(r"__device__ __forceinline__ void (\w+)\(([^)]*), const int ob, unsigned int\* joined\) \{")


def joined(k: Kernel) -> bool:
    """Whether gemv `k` runs as blocks of the launch before it."""
    return k.schedule is not None and bool(k.schedule.param.get("JOIN"))


def cluster_size(host: Kernel) -> int:
    """The blocks of the host's clusters (1 without): the joined grid is a multiple of it."""
    p = host.schedule.param
    return int(p["SPLITS"]) if p.get("unit") == "split" and p.get("CL") else 1


def launch_blocks(host: Kernel, role: Kernel) -> tuple[int, int, int]:
    """(the host's blocks, the role's blocks, the launch's blocks with the idle ones rounding up to its cluster)."""
    a, b = host.schedule.grid[0], role.schedule.grid[0]
    if host.schedule.grid[1:] != (1, 1) or role.schedule.grid[1:] != (1, 1) or role.schedule.param.get("JOIN") != a:
        raise AicfError(f"internal: {role.name} joined to {host.name}: both grids one-dimensional, JOIN = {a} expected")
    cl = cluster_size(host)
    return a, b, -(-(a + b) // cl) * cl


def _code(name: str, body: str) -> str:
    from aicfc.codegen.module import code_of   # a cycle at import otherwise (module renders through here)
    return code_of(name, body)


def _params(signature: str) -> list[tuple[str, str]]:
    """(declaration without its name, name) of each parameter of a generated signature."""
    out = []
    for part in signature.split(","):
        words = part.split()
        out.append((" ".join(words[:-1]), words[-1]))
    return out


def combine(host: Kernel, host_body: str, role: Kernel, role_body: str, trigger_first: bool, sm_count: int) -> str:
    """The module text of `host`'s launch with `role` joined: both bodies as device functions, their counter,
    and the kernel `host.name` dispatching on the block index. `host_body`: the host's kernel as rendered (and
    instrumented); `role_body`: the role rendered under JOIN with the name PLACEHOLDER; `trigger_first`: the role's
    blocks let the next kernel launch at their entry (its TF). The kernel's launch bounds ask for the role's JMB
    blocks an SM (passes/join_launches.launch_min_blocks: one wave, and the room the gemv before left), else for
    the blocks an SM must hold for one wave on `sm_count` SMs, so that ptxas keeps the registers to it."""
    m = _HEADER.search(host_body)
    if m is None or m.group(2) != host.name:
        raise AicfError(f"internal: {host.name} has no kernel header to join {role.name} to")
    r = _ROLE.search(role_body)
    if r is None or r.group(1) != PLACEHOLDER:
        raise AicfError(f"internal: {role.name} was not rendered as a joined role")
    a, b, total = launch_blocks(host, role)
    tag = hashlib.sha256("\0".join([_code(host.name, host_body), _code(PLACEHOLDER, role_body),
                                    repr((host.schedule.block, host.schedule.smem_bytes, a, b))]).encode()).hexdigest()[:12]
    first, second, count = f"aicf_join_{tag}_a", f"aicf_join_{tag}_b", f"aicf_join_{tag}_count"
    head = host_body[:m.start()] + f"__device__ __forceinline__ void {first}({m.group(3)}) {{" + host_body[m.end():]
    role_text = re.sub(rf"\b{PLACEHOLDER}\b", second, role_body)
    head = re.sub(rf"\b{GATE}\b", count, head)   # [Note: the joined role's gate] in passes/join_launches.py
    hp, rp = _params(m.group(3)), _params(r.group(2))
    params = ", ".join([f"{d} a_{n}" for d, n in hp] + [f"{d} b_{n}" for d, n in rp])
    minb = role.schedule.param.get("JMB", -(-total // sm_count))
    bounds = re.sub(r"__launch_bounds__\((\d+)(?:, *\d+)?\)", lambda b: f"__launch_bounds__({b.group(1)}, {minb})", m.group(1))
    if "__launch_bounds__" not in bounds:
        raise AicfError(f"internal: {host.name}'s kernel has no launch bounds to join {role.name} under")
    trigger = "    aicf_pdl_trigger();   // [Note: the trigger before the wait], as its own launch had it\n" if trigger_first else ""
    return f"""// {host.name} and {role.name} as one launch of {total} blocks ([Note: a gemv joined to the launch before it] in
// codegen/join.py): {a} of {host.name}, then {b} of {role.name}{f', {total - a - b} idle' if total > a + b else ''}.
__device__ unsigned int {count}[3];   // {host.name}'s blocks published, {role.name}'s blocks done, {host.name}'s first tiles landed
{head}
{role_text}
extern "C" __global__ void {bounds}{host.name}({params}) {{
  if (blockIdx.x < {a}u) {{
    {first}({", ".join(f"a_{n}" for _, n in hp)});
    __syncthreads();   // every thread's stores before the block's publication
    if (threadIdx.x == 0) {{
      __threadfence();
      atomicAdd(&{count}[0], 1u);
    }}
  }} else if (blockIdx.x < {a + b}u) {{
{trigger}    {second}({", ".join(f"b_{n}" for _, n in rp)}, (int)blockIdx.x - {a}, {count});
  }}
}}
"""
