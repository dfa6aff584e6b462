"""Chat templates rendered with limits: the one place lctx renders a model's chat template.

A chat template is code from the checkpoint (a GGUF file's ``tokenizer.chat_template``, a
``tokenizer_config.json``'s ``chat_template``). transformers renders it in jinja2's
``ImmutableSandboxedEnvironment``, which blocks Python internals but not size: ``{{ 'a' * 2000000000 }}``
allocated 6 GB before anything stopped it. lctx renders it in :class:`BoundedSandbox`, the same sandbox set
up as transformers sets up its own (``transformers.utils.chat_template_utils``: ``trim_blocks``,
``lstrip_blocks``, ``loopcontrols``, ``{% generation %}``, ``tojson``, ``raise_exception``, ``strftime_now``,
``dict``, ``namespace``; the tokenizer's special tokens as variables), so a template renders the same text,
with four limits checked through jinja2's sandbox hooks (``call_binop``/``intercepted_binops``, ``call``)
and its filters, each *before* the operation allocates:

- size: no string, list or output piece an operator (``*``, ``+``, ``%``, ``**``, ``~``), a call, a filter
  (``join``, ``replace``, ``center``, ...) or an output expression makes may exceed
  :func:`size_limit` (characters or elements, counted through nested lists, so ``[s] * n`` counts ``n``
  copies of ``s``), nor the rendered text;
- work: all of those together may produce at most :data:`WORK_FACTOR` times that;
- steps: at most :data:`MAX_STEPS` loop iterations and calls (every ``for`` loop counts its iterations);
- time: at most :data:`MAX_SECONDS` seconds.

Exceeding one raises :class:`~lctx.errors.LctxError` naming the limit and the template's source.
"""

from __future__ import annotations

import contextvars
import json
import re
import string
import time
from collections.abc import ItemsView, KeysView, ValuesView
from datetime import datetime
from functools import lru_cache, wraps

import jinja2
from jinja2 import nodes, pass_context
from jinja2.ext import Extension
from jinja2.runtime import markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

from lctx.errors import LctxError

#: The rendered text (and any one value a template makes) may be this many times the messages' length ...
SIZE_FACTOR = 8
#: ... plus this many characters (a template's own text: turn markers, a default system prompt, dates).
SIZE_ALLOWANCE = 1 << 20
#: All values one render makes together (operators, calls, filters, output pieces): this many size limits.
WORK_FACTOR = 16
#: Loop iterations and calls in one render.
MAX_STEPS = 1_000_000
#: Seconds one render may take.
MAX_SECONDS = 10.0
#: Bits of an integer a template may make (str() of a bigger one is refused by Python anyway: 4300 digits).
MAX_INT_BITS = 1 << 16

_BUDGET: contextvars.ContextVar["_Budget | None"] = contextvars.ContextVar("lctx_chat_budget", default=None)


def size_limit(messages: list[dict]) -> int:
    """The size limit (characters) of one render of ``messages``: :data:`SIZE_FACTOR` times the characters of
    their values plus :data:`SIZE_ALLOWANCE`."""
    return SIZE_FACTOR * sum(len(str(v)) for m in messages for v in m.values()) + SIZE_ALLOWANCE


class TemplateLimitError(Exception):
    """A chat template went past one of the limits of :mod:`lctx.chat` (the message names which)."""


class _Budget:
    """What one render has used: the size limit, the work produced, steps taken, and its deadline."""

    def __init__(self, size: int):
        self.size, self.work_left, self.steps = size, size * WORK_FACTOR, 0
        self.deadline = time.monotonic() + MAX_SECONDS

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"the time limit ({MAX_SECONDS:g} s)")

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise TemplateLimitError(f"the limit of {MAX_STEPS} loop iterations and calls")
        self.tick()

    def fits(self, value, what: str) -> None:
        """Refuse a ``value`` bigger than the size limit that ``what`` is given (a filter's input, a call's
        argument, a namespace's attribute): nothing else can hold one across loop iterations or calls."""
        n = deep_size(value, self.size)
        if n > self.size:
            raise TemplateLimitError(f"the size limit ({self.size} characters): {what} is given one of "
                                     f"{n} or more")

    def want(self, n: int, what: str) -> None:
        """Refuse (before it is made) a value of size ``n`` that ``what`` would make; count it as work."""
        self.tick()
        if n > self.size:
            raise TemplateLimitError(f"the size limit ({self.size} characters): {what} would make {n}")
        self.work_left -= n
        if self.work_left < 0:
            raise TemplateLimitError(f"the work limit ({WORK_FACTOR} x {self.size} characters made in all), "
                                     f"at {what}")


def _budget() -> _Budget | None:
    return _BUDGET.get()


def deep_size(value, cap: int) -> int:
    """Characters (strings), elements (lists, tuples, dicts, sets, each element counted with its own size) or
    decimal digits (ints) of ``value``, as its text would be long up to a small factor; 1 for anything else.
    Stops counting past ``cap`` (shared references are counted each time, so ``[s] * 1000`` is 1000 ``s``)."""
    total, stack = 0, [value]
    while stack and total <= cap:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, bool) or v is None:
            total += 1
        elif isinstance(v, int):
            total += v.bit_length() * 3 // 10 + 1
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += len(v) + 1
            stack.extend(v)
        elif isinstance(v, dict):
            total += len(v) + 1
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (KeysView, ValuesView, ItemsView)):  # d.items(): its text lists the values
            total += 1
            stack.extend(v)
        elif isinstance(v, Namespace):  # its text (repr) lists what it holds
            total += 1
            stack.append(dict(object.__getattribute__(v, "_Namespace__attrs")))
        else:
            total += 1
    return total


def _seq_size(v, cap: int) -> int | None:
    """The deep size of a string/list/tuple, else ``None`` (not a sequence ``*`` and ``+`` repeat)."""
    return deep_size(v, cap) if isinstance(v, (str, list, tuple)) else None


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


#: printf-style conversions (``'%-2000000000s' % x``): width and precision, ``*`` taken from the arguments.
_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
_DIGITS = re.compile(r"\d+")


def _printf_size(fmt: str, args, cap: int) -> int:
    """An upper bound of ``len(fmt % args)``: the format, the arguments, and every width and precision."""
    n = len(fmt) + deep_size(args, cap)
    ints = [abs(a) for a in (args if isinstance(args, tuple) else (args,)) if _int(a) is not None]
    for m in _PRINTF.finditer(fmt):
        for g in m.groups():
            if g == "*":
                n += max(ints, default=0)
            elif g:
                n += int(g)
    return n


def _format_size(fmt: str, args, kwargs, cap: int) -> int:
    """An upper bound of ``len(fmt.format(*args, **kwargs))`` (fields parsed by :class:`string.Formatter`): the
    format, the arguments, and every number in a field's spec (a nested ``{}`` spec: the largest int argument)."""
    n = len(fmt) + deep_size(list(args), cap) + deep_size(dict(kwargs), cap)
    ints = [abs(a) for a in (*args, *kwargs.values()) if _int(a) is not None]
    for _, field, spec, _ in string.Formatter().parse(fmt):
        if field is not None and spec:
            n += sum(int(d) for d in _DIGITS.findall(spec)) + (max(ints, default=0) if "{" in spec else 0)
    return n


def _int_bits(op: str, left, right) -> int | None:
    """An upper bound of the bits of ``left <op> right`` for two ints (``*``, ``**``), else ``None``."""
    if _int(left) is None or _int(right) is None:
        return None
    if op == "*":
        return left.bit_length() + right.bit_length()
    if op == "**" and right > 0 and abs(left) > 1:
        return left.bit_length() * right
    return None


def _binop_size(op: str, left, right, cap: int) -> int | None:
    """An upper bound of the size of ``left <op> right`` (``*``, ``+`` of sequences, ``%`` of a string)."""
    if op == "*":
        for seq, k in ((left, right), (right, left)):
            size = _seq_size(seq, cap)
            if size is not None and _int(k) is not None:
                return size * max(k, 0)
    elif op == "+":
        a, b = _seq_size(left, cap), _seq_size(right, cap)
        if a is not None and b is not None:
            return a + b
    elif op == "%" and isinstance(left, str):
        return _printf_size(left, right, cap)
    return None


def _join_size(seq, sep, cap: int) -> int:
    return deep_size(list(seq), cap) + len(str(sep)) * max(len(seq) - 1, 0)


def _replace_size(s: str, old: str, new: str, count: int = -1) -> int:
    n = s.count(old) if old else len(s) + 1
    if _int(count) is not None and count >= 0:
        n = min(n, count)
    return len(s) + n * max(len(new) - len(old), 0)


def _width(w) -> int:
    return w if _int(w) is not None else len(str(w))


def _str_method_size(s: str, name: str, args, kwargs, cap: int) -> int | None:
    """An upper bound of the size a ``str`` method makes from ``s``, for the methods that can grow it."""
    a = list(args) + list(kwargs.values())
    if name in ("ljust", "rjust", "center", "zfill") and a and _int(a[0]) is not None:
        return max(len(s), a[0])
    if name == "expandtabs":
        return len(s) + s.count("\t") * max(_int(a[0]) if a and _int(a[0]) is not None else 8, 0)
    if name == "replace" and len(a) >= 2:
        return _replace_size(s, str(a[0]), str(a[1]), *a[2:3])
    if name == "join" and a:
        return _join_size(list(a[0]), s, cap)
    if name in ("format", "format_map"):
        return _format_size(s, args, kwargs if name == "format" else (a[0] if a else {}), cap)
    if name == "translate" and a and isinstance(a[0], dict):
        return len(s) * max([1] + [len(str(v)) for v in a[0].values() if v is not None])
    return None


def _filter_size(name: str, args, kwargs, env, cap: int) -> int | None:
    """An upper bound of the size filter ``name`` makes from ``args`` (the value first), for the filters that can
    make much more than they are given (jinja2.filters' signatures)."""
    if not args:
        return None
    v, rest = args[0], list(args[1:])

    def arg(i, key, default):
        return rest[i] if len(rest) > i else kwargs.get(key, default)

    if name == "join":
        return _join_size(v, arg(0, "d", ""), cap)
    if name == "replace":
        return _replace_size(str(v), str(arg(0, "old", "")), str(arg(1, "new", "")), arg(2, "count", None))
    if name == "center":
        return max(len(str(v)), _width(arg(0, "width", 80)))
    if name == "indent":
        return len(str(v)) + (str(v).count("\n") + 1) * _width(arg(0, "width", 4))
    if name == "wordwrap":
        return len(str(v)) * (1 + len(str(arg(3, "wrapstring", None) or env.newline_sequence)))
    if name in ("batch", "slice") and _int(arg(0, "linecount" if name == "batch" else "slices", 0)) is not None:
        return deep_size(v, cap) + abs(arg(0, "linecount" if name == "batch" else "slices", 0))
    if name == "format":
        return _printf_size(str(v), tuple(rest) or kwargs, cap)
    if name == "tojson":
        return deep_size(v, cap) * (1 + _width(arg(1, "indent", 0) or 0))
    return None


def _bounded_filter(name: str, func, env):
    """``func`` (a filter) checked before (:func:`_filter_size`) and after (the size of what it returns)."""
    skip = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0  # context / eval_ctx / environment

    @wraps(func)
    def bounded(*args, **kwargs):
        b = _budget()
        if b is None:  # jinja2 folding a filter of constants at compile time: left to the render, checked
            raise nodes.Impossible()
        args = list(args)
        if name == "join" and len(args) > skip and not isinstance(args[skip], (list, tuple, str)):
            args[skip] = list(args[skip])  # a generator (map, select): measured as it will be joined
        for a in (*args[skip:], *kwargs.values()):
            b.fits(a, f"the {name} filter")
        size = _filter_size(name, args[skip:], kwargs, env, b.size)
        if size is not None:
            b.want(size, f"the {name} filter")
        out = func(*args, **kwargs)
        b.want(deep_size(out, b.size), f"the {name} filter")
        return out

    return bounded


@pass_context
def _steps(context, iterable):
    """A ``for`` loop's iterable, each iteration counted (:data:`MAX_STEPS`) and timed."""
    b = _budget()
    for item in iterable:
        if b is not None:
            b.step()
        yield item


@pass_context
def _emit(context, value):
    """A value about to be output (at any level: also inside ``{% set %}`` blocks, macros, filter blocks)."""
    b = _budget()
    if b is not None:
        b.want(deep_size(value, b.size), "an output expression")
    return value


@pass_context
def _concat(context, values):
    """The ``~`` operator (``a ~ b ~ c``), its size checked before the strings are joined."""
    b = _budget()
    if b is not None:
        b.want(deep_size(values, b.size), "the ~ operator")
    return (markup_join if context.eval_ctx.autoescape else str_join)(values)


def _wrap(node, name: str):
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)


class _Bound(NodeTransformer):
    """Rewrites a parsed template so that every loop, ``~`` and output piece passes through the checks."""

    def visit_For(self, node):
        node = self.generic_visit(node)
        node.iter = _wrap(node.iter, "lctx_steps")
        return node

    def visit_Concat(self, node):
        node = self.generic_visit(node)
        return _wrap(nodes.List(node.nodes, lineno=node.lineno), "lctx_concat")

    def visit_Output(self, node):
        node = self.generic_visit(node)
        node.nodes = [_wrap(nodes.Const(n.data, lineno=n.lineno) if isinstance(n, nodes.TemplateData) else n,
                            "lctx_emit") for n in node.nodes]
        return node


class _Generation(Extension):
    """transformers' ``{% generation %} ... {% endgeneration %}`` block (it marks the assistant's tokens for
    training masks), rendered as its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class _TemplateDict:
    """``dict`` as transformers gives it to templates: a call and ``fromkeys``, no class to reach through."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(Namespace):
    """``namespace`` as transformers gives it to templates: no underscore-prefixed attributes; and no attribute
    bigger than the size limit."""

    def __init__(*args, **kwargs):  # noqa: N805 - jinja2.utils.Namespace's own signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name, value in attrs.items():
            _TemplateNamespace._check(name, value)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check(name, value)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name, value):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot store underscore-prefixed attributes "
                                                  f"on a namespace ({name!r})")
        b = _budget()
        if b is not None:  # what a loop carries from one iteration to the next: at most the size limit
            b.fits(value, f"namespace attribute {name!r}")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox with the size, work, step and time limits of :mod:`lctx.chat`,
    set up as transformers sets up the sandbox it renders chat templates in. The limits apply while
    :func:`render_chat` renders (a context variable holds the render's budget)."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self):
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, "jinja2.ext.loopcontrols"])
        self.filters["tojson"] = _tojson
        self.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(),
                            namespace=_TemplateNamespace)
        self.filters = {name: _bounded_filter(name, f, self) for name, f in self.filters.items()}
        self.filters.update(lctx_steps=_steps, lctx_emit=_emit, lctx_concat=_concat)

    def call_binop(self, context, operator, left, right):
        """``*``, ``**``, ``+``, ``%``: the result's size checked before it is computed."""
        b = _budget()
        if b is not None:
            bits = _int_bits(operator, left, right)
            if bits is not None and bits > MAX_INT_BITS:
                raise TemplateLimitError(f"the integer limit ({MAX_INT_BITS} bits): the {operator} operator "
                                         f"would make one of {bits}")
            size = _binop_size(operator, left, right, b.size)
            if size is not None:
                b.want(size, f"the {operator} operator")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - the sandbox's own signature
        """A call from the template: counted as a step; a ``str`` method that can grow its string checked
        before it runs (:func:`_str_method_size`), every result after."""
        b = _budget()
        if b is None:
            return super().call(__context, __obj, *args, **kwargs)
        b.step()
        name = getattr(__obj, "__name__", None) or getattr(__obj, "name", None) or "a function"  # a macro: .name
        for a in (*args, *kwargs.values()):
            b.fits(a, f"a call of {name}")
        method = getattr(__obj, "__wrapped__", __obj)  # str.format comes wrapped by the sandbox
        if isinstance(getattr(method, "__self__", None), str):
            if name == "join" and args and not isinstance(args[0], (list, tuple, str)):
                args = (list(args[0]), *args[1:])  # a generator: measured as it will be joined
            size = _str_method_size(method.__self__, name, args, kwargs, b.size)
            if size is not None:
                b.want(size, f"str.{name}")
        elif __obj is __self.globals.get("lipsum"):  # generate_lorem_ipsum(n=5, html=True, min=20, max=100)
            n, _, lo, hi = (*args, *(5, True, 20, 100)[len(args):])
            b.want(12 * _width(kwargs.get("n", n)) * max(_width(kwargs.get("min", lo)), _width(kwargs.get("max", hi))),
                   "lipsum")
        out = super().call(__context, __obj, *args, **kwargs)
        b.want(deep_size(out, b.size), f"a call of {name}")
        return out


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """``source`` (a chat template's text) parsed, rewritten so that loops, ``~`` and output are checked, and
    compiled in a :class:`BoundedSandbox`.

    Raises:
        jinja2.TemplateSyntaxError: the template does not parse.
    """
    env = BoundedSandbox()
    return env.from_string(_Bound().visit(env.parse(source)))


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                continue_final_message: bool = False, source: str = "the model", variables: dict | None = None) -> str:
    """The text of ``messages`` in ``tokenizer``'s chat template, as ``tokenizer.apply_chat_template(messages,
    tokenize=False, add_generation_prompt=..., continue_final_message=...)`` writes it, rendered with limits.

    ``source`` names where the template comes from in the error (e.g. "model 'x' (/path/x.gguf)");
    ``variables``: more template variables (``apply_chat_template``'s ``**kwargs``, over the special tokens).

    Raises:
        LctxError: the render went past a limit (size, work, steps, time, an integer's size, or memory); the
            message names the limit and ``source``.
        jinja2.TemplateError: the template refuses the messages (``raise_exception``) or does not parse.
        ValueError: the tokenizer has no chat template.
    """
    template = compile_template(tokenizer.get_chat_template())
    msgs = [{k: v for k, v in m.items() if v is not None} for m in messages]
    tag = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' way of leaving the last message open
    final = msgs[-1].get("content", "") if continue_final_message and msgs else None
    if final is not None:
        msgs[-1] = {**msgs[-1], "content": final + tag}
    token = _BUDGET.set(_Budget(size_limit(msgs)))
    try:
        b, pieces, n = _BUDGET.get(), [], 0
        for piece in template.generate(messages=msgs, tools=None, documents=None,
                                       add_generation_prompt=add_generation_prompt,
                                       **{**tokenizer.special_tokens_map, **(variables or {})}):
            n += len(piece)
            if n > b.size:
                raise TemplateLimitError(f"the output limit ({b.size} characters: {SIZE_FACTOR} x the messages' "
                                         f"length + {SIZE_ALLOWANCE})")
            pieces.append(piece)
        text = "".join(pieces)
    except TemplateLimitError as e:
        raise LctxError(f"the chat template of {source} went past {e} while rendering a prompt; fix the template "
                        "or use --chat-template off") from None
    except (MemoryError, RecursionError) as e:
        what = "memory" if isinstance(e, MemoryError) else "stack"
        raise LctxError(f"the chat template of {source} ran out of {what} while rendering a prompt; fix the template "
                        "or use --chat-template off") from None
    finally:
        _BUDGET.reset(token)
    if final is not None:  # as transformers' render_jinja_template cuts at the tag
        if final.strip() not in text or tag.strip() not in text:
            raise jinja2.exceptions.TemplateError("the chat template does not write the final message verbatim")
        at = text.rindex(tag.strip())
        text = text[:at] if text[at:at + len(tag)] == tag else text[:at].rstrip()
    return text
