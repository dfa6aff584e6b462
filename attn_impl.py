"""The attention implementations of lctx models (``--attn-impl``, ``LctxConfig.attn_impl``): one registry,
:data:`ATTN_IMPL_REGISTRY` ({name: :class:`AttnImpl`}), as transformers' ``ALL_ATTENTION_FUNCTIONS``
(``ALL_ATTENTION_FUNCTIONS.get_interface(impl, default)`` in ``transformers.modeling_utils``).

Each entry says how a variant computes attention on that path (:attr:`AttnImpl.kernels`,
:attr:`AttnImpl.explicit`, :attr:`AttnImpl.fallback`) and whether it applies to Hugging Face checkpoints
(:attr:`AttnImpl.hf`: ``eager``, ``sdpa``, or lctx's ``lctx_sdpa``, registered with transformers by
:mod:`lctx.models.adapters.hf_attention`); code looks the entry up once (where a layer's forward starts, where a memory plan or a
check begins: :func:`get_attn_impl`) and reads its attributes instead of comparing names. Registered here:
``reference``, ``sdpa``, ``fast``, in that order (:data:`lctx.ATTN_IMPLS` is their names).

A leaf of the package root (it imports :mod:`lctx.registry` and :mod:`lctx.errors` only, no torch), so the
CLI's argument checks read it before anything heavy loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from lctx.errors import LctxError
from lctx.registry import Registry


@dataclass(frozen=True)
class AttnImpl:
    """One attention implementation of lctx models.

    name: the ``--attn-impl`` / ``config.attn_impl`` value; doc: one line for help and docs;
    hf: the ``attn_implementation`` transformers runs for a Hugging Face checkpoint under this name
    (``"eager"``, ``"sdpa"``, ``"lctx_sdpa"``), or ``None`` when it applies to lctx checkpoints only;
    kernels: a layer first tries its variant's fast path from :mod:`lctx.kernels` (Triton, FlexAttention, the
    blocked / vectorised CPU forms; a variant or a call without one takes :attr:`fallback`);
    explicit: the source of truth: explicit fp32 softmax (:func:`lctx.models.variants.reference_attention`)
    and each variant's plain PyTorch form, no external kernel (fla) and nothing recorded by
    :func:`lctx.kernels.record_impl`;
    fallback: the name of the path a call runs where this one has no form (padded rows, diagnostics
    probes; the memory plan's one-layer probe): this entry's own name, or ``"sdpa"`` for ``fast``.
    """

    name: str
    doc: str
    hf: str | None = None
    kernels: bool = False
    explicit: bool = False
    fallback: str = ""

    def __post_init__(self):
        if not self.fallback:
            object.__setattr__(self, "fallback", self.name)

    @property
    def records_module_form(self) -> bool:
        """Whether a variant without an SDPA form (``alibi_lsh``, ``path``, the fixed-state mixers) records
        the blockwise / chunked PyTorch form it runs instead (``sdpa``: yes; ``reference`` records nothing;
        ``fast`` records the kernel it chose)."""
        return not (self.kernels or self.explicit)


class AttnImplRegistry(Registry[AttnImpl]):
    """{name: :class:`AttnImpl`} in registration order, with transformers' lookup
    (``AttentionInterface.get_interface``).

    Raises (:meth:`lookup`):
        LctxError: an unknown name, in one line naming the registered ones.
    """

    def register(self, impl: AttnImpl) -> AttnImpl:
        """Register ``impl`` under its name; returns it.

        Raises:
            ValueError: the name is empty or already registered; a ``fallback`` that is not registered.
        """
        if impl.fallback != impl.name and impl.fallback not in self:
            raise ValueError(f"attention implementation {impl.name!r} falls back to unregistered {impl.fallback!r}")
        return self.add(impl.name, impl)

    def names(self) -> tuple[str, ...]:
        """The registered names in registration order (``reference``, ``sdpa``, ``fast``)."""
        return tuple(self)

    def get_interface(self, name: str, default: AttnImpl | None = None) -> AttnImpl | None:
        """The entry of ``name``, or ``default`` when none is registered under it (transformers' signature)."""
        return self.get(name, default)

    def lookup(self, name: str) -> AttnImpl:
        """The entry of ``name``.

        Raises:
            LctxError: ``name`` is not registered (``unknown attention implementation 'x'; use reference, sdpa,
                fast``).
        """
        entry = self.get(name) if isinstance(name, str) else None
        if entry is None:
            raise LctxError(f"unknown attention implementation {name!r}; use {', '.join(self)}")
        return entry


#: The attention implementations, in the order ``--help`` and error messages name them.
ATTN_IMPL_REGISTRY = AttnImplRegistry("attention implementation")
ATTN_IMPL_REGISTRY.register(AttnImpl(
    "reference", "explicit fp32 softmax and each variant's plain PyTorch form: the source of truth", hf="eager",
    explicit=True))
ATTN_IMPL_REGISTRY.register(AttnImpl(
    "sdpa", "PyTorch scaled_dot_product_attention with the variant's bias as a float mask; variants without a "
    "softmax form run their blockwise / chunked PyTorch form", hf="sdpa"))
ATTN_IMPL_REGISTRY.register(AttnImpl(
    "fast", "the variant's kernel from lctx.kernels (Triton / FlexAttention on GPU, the blocked / vectorised "
    "forms on CPU); sdpa where a variant or a call has none. Hugging Face checkpoints: lctx_sdpa (SDPA with "
    "a chunked prefill's cached keys unmasked and its own keys causal, merged by log-sum-exp; sliding windows "
    "per block of the window). The default", hf="lctx_sdpa", kernels=True, fallback="sdpa"))

#: The ``--attn-impl`` a checkpoint runs when none is given (lctx and Hugging Face checkpoints alike): the lean
#: path, which materialises no T x chunk mask.
DEFAULT_ATTN_IMPL = "fast"


def get_attn_impl(name: str) -> AttnImpl:
    """The registered :class:`AttnImpl` called ``name`` (:meth:`AttnImplRegistry.lookup`).

    Raises:
        LctxError: ``name`` is not registered.
    """
    return ATTN_IMPL_REGISTRY.lookup(name)
