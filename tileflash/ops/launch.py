"""Kernel launch plans shared by the Triton and Gluon families: a launch built once per call
layout (:class:`Launch`), the compiled-launcher shortcut for TMA descriptors (:class:`DescRunner`),
and the fall-back rule for a kernel that does not compile with the installed triton."""

from __future__ import annotations

import functools
import inspect
import warnings

import torch
import triton

from tileflash.options import DEBUG


def compile_error(e: Exception) -> bool:
    """Whether e is triton failing to build a kernel (a frontend CompilationError, or the MLIR
    pass manager's RuntimeError), as opposed to an error of this call's inputs or of the GPU."""
    from triton.compiler.errors import CompilationError

    return isinstance(e, CompilationError) or (isinstance(e, RuntimeError) and "PassManager" in str(e))


def launch_or_fall_back(broken: set, key, what: str, hint: str, launch) -> bool:
    """Run launch() (every launch may compile: triton specializes on argument values, e.g. a GQA
    group of 1). True if it ran. If triton fails to build the kernel (Gluon's API changes between
    releases), warn, record key in `broken` (the callers' routing then skips that configuration)
    and return False, so that the caller runs its Triton kernel; any other error propagates."""
    try:
        launch()
    except Exception as e:  # noqa: BLE001  (anything but a compile failure is re-raised)
        if not compile_error(e):
            raise
        broken.add(key)
        warnings.warn(f"tileflash: {what} failed to compile with triton {triton.__version__} "
                      f"({type(e).__name__}: {str(e)[:200]}); {hint}", RuntimeWarning, stacklevel=4)
        return False
    return True


class Launch:
    """One kernel launch whose grid, integer arguments and constexprs follow from a call's layout
    (shapes, strides, dtypes, device), built once per layout so that a repeated call pays for
    neither the argument binding of triton's JIT nor the validation of its tensor descriptors
    (host time; docs/perf-notes.md, "Host path"). The forward's :class:`_Plan` is one; the
    backward keeps one per kernel (``gluon.backward``, ``triton.backward._bwd_preprocess``).

    A call passes ``tensors`` (the descriptors' tensors, in ``templates``' order), ``ptrs`` (the
    raw tensor arguments after the descriptors) and ``scales`` (the floats after ``ints``): the
    kernel's runtime parameters are exactly descriptors, ptrs, ints, scales, in that order, and
    the rest are constexprs (``tail``: their values, defaults included, positionally). The first
    launch goes through triton's JIT, which compiles or finds the kernel and checks every
    specialization; later ones, with ``cacheable`` true, through the compiled kernel's own
    launcher (``runner``: the CUDA device it was made on, and the launcher). That is sound only
    when every value triton specializes on is fixed by the layout key or by the caller's
    ``cacheable`` test (raw pointers' 16-byte alignment), and the current CUDA device is the one
    the runner was made on (its function handle is that device's). Triton's launch hooks (profilers) still run, since the runner reads them at every
    launch; a change of triton's compile options (e.g. its debug knob) after a layout's first call
    is not seen by that layout.

    ``templates`` are validated ``TensorDescriptor`` objects with ``base=None`` (a launch holds no
    tensor); :meth:`descriptors` copies them onto the call's tensors. ``slots``: the descriptors'
    positions among the runtime parameters, ascending, for a kernel whose descriptors are not all
    first (the fused backward's dQ descriptor follows four pointers); the other runtime parameters
    keep their order around them. Default: the first ``len(templates)``."""

    __slots__ = ("kernel", "grid", "templates", "ints", "constexprs", "tail", "runner", "slots")

    def __init__(self, kernel, grid, templates, n_ptrs: int, ints: tuple, n_scales: int, constexprs: dict,
                 slots: tuple | None = None):
        for t in templates:
            t.base = None
        self.kernel, self.templates, self.ints, self.constexprs = kernel, tuple(templates), ints, constexprs
        slots = tuple(range(len(templates))) if slots is None else tuple(slots)
        if len(slots) != len(templates) or list(slots) != sorted(set(slots)) or (slots and slots[0] < 0):
            raise ValueError(f"Launch: descriptor slots {slots} for {len(templates)} descriptors must ascend")
        # None where the descriptors come first (the common case: no interleaving per call)
        self.slots = None if slots == tuple(range(len(templates))) else slots
        self.grid = tuple(grid) + (1,) * (3 - len(grid))  # CompiledKernel[grid] indexes all three
        # the constexpr parameters in the kernel's order (defaults included): the compiled kernel's
        # launcher takes every parameter positionally and skips the constexprs
        # (the CPU interpreter's kernels have no params: they never get a runner)
        params = getattr(kernel, "params", ())[len(templates) + n_ptrs + len(ints) + n_scales:]
        self.tail = tuple(constexprs[p.name] if p.name in constexprs else p.default for p in params)
        self.runner = None  # (CUDA device index, the compiled kernel's launcher on it): one attribute, so
        # that a thread never pairs one device's launcher with another's index

    def ints_with(self, index: int, value: int) -> tuple:
        """The plan's integer arguments with the one at `index` replaced by `value` (for
        :meth:`__call__`'s ``ints``: an argument that varies per call and that triton does not
        specialize on)."""
        ints = self.ints
        return ints if ints[index] == value else ints[:index] + (value,) + ints[index + 1:]

    def descriptors(self, *tensors):
        return tuple(rebase(t, x) for t, x in zip(self.templates, tensors))

    def __call__(self, tensors, ptrs, scales, cacheable, ints=None):
        # ``cacheable``: a bool, or :func:`addresses` of ``ptrs`` (a tuple: all aligned, and the
        # compiled launcher takes those integers in place of the tensors; False: one is not).
        # scales as floats: triton would specialize an integer 1 into a constexpr, and the cached
        # launcher skips constexpr slots. ``ints``: this call's integer arguments in place of the
        # plan's, for kernels whose varying ints triton does not specialize (``do_not_specialize``)
        runner, addrs = self.runner, (cacheable if cacheable.__class__ is tuple else None)
        cacheable = addrs is not None or cacheable
        # (a runner exists only after a CUDA launch, so CUDA is initialized: torch's current-device
        # getter without torch.cuda.current_device()'s Python layer, host time)
        if runner is not None and cacheable and torch._C._cuda_getDevice() == runner[0]:
            rest = (*(ptrs if addrs is None else addrs), *(self.ints if ints is None else ints), *map(float, scales))
            if runner[1].__class__ is DescRunner:  # no descriptor objects unless it needs them
                runner[1].call_tensors(self.templates, tensors, (*rest, *self.tail))
            elif self.slots is None:
                runner[1](*self.descriptors(*tensors), *rest, *self.tail)
            else:
                runner[1](*interleave(self.slots, self.descriptors(*tensors), rest), *self.tail)
            return
        rest = (*ptrs, *(self.ints if ints is None else ints), *map(float, scales))
        args = interleave(self.slots, self.descriptors(*tensors), rest)
        kernel = self.kernel[self.grid](*args, **self.constexprs)
        if hasattr(kernel, "result"):  # triton's asynchronous compile mode hands back a future
            kernel = kernel.result()
        if cacheable and hasattr(kernel, "__getitem__"):
            runner = kernel[self.grid]  # (this also loads the kernel's handles, which DescRunner reads)
            self.runner = (torch.cuda.current_device(),
                           DescRunner.make(kernel, runner, self.grid, len(self.templates), self.slots) or runner)


def interleave(slots, items, rest, flat: bool = False) -> tuple:
    """``rest`` with ``items[i]`` at position ``slots[i]`` of the result (positions counted with one
    entry per item; ``slots`` ascending), or ``(*items, *rest)`` where ``slots`` is None (the items
    first). ``flat`` (with slots): each item is a sequence whose entries are spliced in at its
    position (a descriptor expanded into triton's map, shape and strides)."""
    if slots is None:  # (flat with no slots is not needed: DescRunner splices those itself)
        return (*items, *rest)
    out, r = [], 0
    for j, (s, item) in enumerate(zip(slots, items)):
        n = s - j - r  # the other arguments before this item that are not placed yet
        out += rest[r:r + n]
        r += n
        if flat:
            out += item
        else:
            out.append(item)
    out += rest[r:]
    return tuple(out)


class DescRunner:
    """A compiled kernel's launcher that converts each TMA descriptor once per base address.

    triton's launcher turns every host-side ``TensorDescriptor`` argument into a ``CUtensorMap``
    (``make_tensordesc_arg``: a ``cuTensorMapEncodeTiled`` call and Python around it) at every
    launch (most of the backward's per-launch host time). Within one
    :class:`Launch` a descriptor's shape, strides, block, dtype and swizzle are fixed by the
    layout key, so the encoded map depends on the base address alone: this runner keeps the maps
    per (descriptor slot, address), encodes a new address with triton's own code, and calls the C
    launcher that triton's wrapper would call, with the same arguments. A map kept for an address
    whose tensor was freed is only used again if a tensor of the same layout sits at that address,
    for which it is the right map. At most ``MAX_PER_SLOT`` addresses per slot (then emptied).

    Built by :meth:`make` only when this triton's CUDA launcher has the structure it was written
    against (triton 3.6: ``CudaLauncher.launch`` wrapping the C launcher with the descriptors
    first among the arguments, lowered to ``CUtensorMap``, and no scratch memory); else None,
    and the caller keeps triton's runner. Launch hooks (triton's profiling knobs) make it hand
    the launch to triton's runner. A kernel without descriptors (the decode and append kernels)
    gets one too: it calls the C launcher without triton's Python layers around it (launch
    metadata, scratch allocation), which cost host time at every launch."""

    MAX_PER_SLOT = 64
    __slots__ = ("fallback", "raw", "metas", "encode", "maps", "grid", "function", "packed", "coop", "pdl",
                 "n_desc", "device", "slots")

    @classmethod
    def make(cls, compiled, fallback, grid, n_desc, slots=None):
        """The runner of `compiled` (a loaded ``CompiledKernel``) for a 3-D `grid` whose first
        `n_desc` arguments are tensor descriptors (0: none; the runner then only skips the Python
        layers of triton's runner), or None; `fallback` is triton's runner (``compiled[grid]``),
        used whenever a launch hook is set. ``slots``: the descriptors' argument positions where
        they are not the first `n_desc` (:class:`Launch`'s ``slots``; None: the first)."""
        try:
            from triton.backends.nvidia import driver as nv_driver

            launcher = compiled.run
            inner = launcher.launch
            if n_desc == 0:
                # no descriptor argument: triton 3.6 hands the C launcher itself (no Python wrapper)
                if hasattr(inner, "__code__"):
                    return None
                raw, metas = inner, ()
            else:
                names = inner.__code__.co_freevars
                if set(names) != {"launcher", "tensordesc_indices", "tensordesc_meta"}:
                    return None
                cells = dict(zip(names, (c.cell_contents for c in inner.__closure__)))
                metas, indices, raw = cells["tensordesc_meta"], cells["tensordesc_indices"], cells["launcher"]
                want = list(range(n_desc) if slots is None else slots)  # the descriptors' argument positions
                if (sorted(indices) != want or len(metas) != n_desc or any(m is None for m in metas)
                        or len(inspect.signature(nv_driver.make_tensordesc_arg).parameters) != 2):
                    return None
            # triton 3.6's C launcher: grid x/y/z, stream, function, cooperative, pdl, two scratch
            # buffers, packed metadata, launch metadata, enter and exit hooks, then the kernel's arguments
            if (launcher.global_scratch_size or launcher.profile_scratch_size
                    or getattr(launcher, "num_ctas", 1) != 1 or nv_driver._BASE_ARGS_FORMAT != "iiiKKppOOOOOO"):
                return None
            self = object.__new__(cls)
            self.fallback = fallback
            self.raw, self.metas, self.encode = raw, tuple(metas), nv_driver.make_tensordesc_arg
            self.maps = tuple({} for _ in range(n_desc))
            self.grid, self.function, self.packed = grid, compiled.function, compiled.packed_metadata
            self.coop, self.pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
            self.n_desc, self.device = n_desc, torch.cuda.current_device()
            self.slots = None if slots is None or tuple(slots) == tuple(range(n_desc)) else tuple(slots)
            return self
        except Exception:  # noqa: BLE001 -- another triton: keep its own runner
            return None

    def __call__(self, *args):
        """Launch with triton's arguments (the descriptors at their slots among the others)."""
        n, slots = self.n_desc, self.slots
        if slots is None:
            return self._launch(tuple(d.base for d in args[:n]), args.__getitem__, args[n:])
        descs = tuple(args[s] for s in slots)
        rest = tuple(a for i, a in enumerate(args) if i not in slots)
        return self._launch(tuple(d.base for d in descs), descs.__getitem__, rest)

    def call_tensors(self, templates, tensors, rest):
        """Launch with the descriptors' tensors instead of descriptors (each with the layout of its
        template in `templates`) and `rest`, the other arguments in order: a descriptor
        object is made only to encode an address not seen before, or for triton's runner."""
        return self._launch(tensors, lambda i: rebase(templates[i], tensors[i]), rest)

    def _launch(self, tensors, descriptor, rest):
        # descriptor(i): the descriptor of slot i (made on demand)
        knobs = triton.knobs.runtime  # hooks: None or a HookChain (triton 3.6), empty unless a profiler set one
        enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
        if getattr(enter, "calls", enter) or getattr(leave, "calls", leave) or not DEBUG.desc_cache:
            return self.fallback(*interleave(self.slots, [descriptor(i) for i in range(self.n_desc)], rest))
        expanded, slots = [], self.slots
        for i, (t, maps, meta) in enumerate(zip(tensors, self.maps, self.metas)):
            addr = t.data_ptr()
            m = maps.get(addr)
            if m is None:
                if len(maps) >= self.MAX_PER_SLOT:
                    maps.clear()
                m = maps[addr] = tuple(self.encode(descriptor(i), meta))
            if slots is None:
                expanded += m
            else:
                expanded.append(m)
        if slots is not None:  # (descriptors among the other arguments: placed, each expanded)
            expanded, rest = interleave(slots, expanded, rest, True), ()
        g = self.grid
        self.raw(g[0], g[1], g[2], torch._C._cuda_getCurrentRawStream(self.device), self.function, self.coop,
                 self.pdl, None, None, self.packed, None, None, None, *expanded, *rest)


def addresses(*tensors):
    """The tensors' device addresses (None entries kept as None), as :meth:`Launch.__call__`'s
    ``cacheable``: the compiled launcher then takes the integers, and triton's C launcher skips, per
    tensor, the ``data_ptr`` call and the driver's pointer query (``cuPointerGetAttribute``) it
    makes for a tensor argument (host time per launch). False if one is not 16-byte aligned (triton
    specializes raw pointers on that: no cached launcher then). With the debug switch ``ptr_ints``
    off, :func:`aligned`'s bool (the tensors themselves are passed)."""
    if not DEBUG.ptr_ints:
        return aligned(*tensors)
    out = []
    for t in tensors:  # (a loop: host time per call)
        if t is None:
            out.append(None)
        else:
            a = t.data_ptr()
            if a & 15:
                return False
            out.append(a)
    return tuple(out)


def aligned(*tensors) -> bool:
    """Whether every given pointer (None entries skipped) is 16-byte aligned, as triton specializes
    raw pointers on that: a cached launcher (:class:`Launch`) is used only then (and made only then)."""
    for t in tensors:  # (a loop, not all() over a generator: host time per call)
        if t is not None and t.data_ptr() & 15:
            return False
    return True


@functools.lru_cache(maxsize=None)
def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device (1 elsewhere: CPU tensors only build plans in tests)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def rebase(template, t):
    """``template`` (a validated descriptor) on tensor t's memory, without re-running the checks of
    ``TensorDescriptor.__post_init__`` (t has the template's layout: the plan's key says so)."""
    d = object.__new__(type(template))
    d.__dict__.update(template.__dict__)
    d.base = t
    return d


