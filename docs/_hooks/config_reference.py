"""The configuration reference page, generated from the pydantic settings so that it cannot drift from the code."""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from markdown_text import code, escape
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from tieredstore.config import TieredStoreConfig

ENV_PREFIX = "TIEREDSTORE_"
MIB = 1 << 20


@dataclass(frozen=True)
class SettingDoc:
    """One setting: where it lives (TOML table and key, environment variable), its type, default and meaning."""

    section: str  # "" for the top level
    name: str
    type: str
    default: str
    constraints: str
    description: str

    @property
    def environment_variable(self) -> str:
        dotted = f"{self.section}__{self.name}" if self.section else self.name
        return (ENV_PREFIX + dotted).upper()


def sections() -> Iterator[tuple[str, str, type[BaseModel]]]:
    """``(table name, docstring, model)`` for the top level (table name ``""``) and each TOML table."""
    yield "", _doc(TieredStoreConfig), TieredStoreConfig
    for name, field in TieredStoreConfig.model_fields.items():
        if _is_section(field):
            model = typing.cast(type[BaseModel], field.annotation)
            yield name, _doc(model), model


def setting_docs() -> Iterator[SettingDoc]:
    """Every setting, section by section, in declaration order."""
    for section, _, model in sections():
        for name, field in model.model_fields.items():
            if not _is_section(field):
                yield SettingDoc(
                    section=section,
                    name=name,
                    type=type_name(field.annotation),
                    default=_default(field),
                    constraints=_constraints(field),
                    description=field.description or "",
                )


def configuration_reference_markdown() -> str:
    """The reference as Markdown: a table per TOML table, a row per setting."""
    by_section: dict[str, list[SettingDoc]] = {}
    for setting in setting_docs():
        by_section.setdefault(setting.section, []).append(setting)
    lines: list[str] = []
    for section, doc, _ in sections():
        lines += [f"### {f'[{section}]' if section else 'Top level'}", "", escape(doc), ""]
        lines += ["| setting | type | default | bounds | meaning |", "|---|---|---|---|---|"]
        for setting in by_section.get(section, []):
            where = f"{code(setting.name)}<br>{code(setting.environment_variable)}"
            cells = (where, setting.type, setting.default, setting.constraints, escape(setting.description))
            lines.append("| " + " | ".join(cell or "&nbsp;" for cell in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def type_name(annotation: Any) -> str:
    """A reader's name for a field's type: ``int``, ``str or none``, ``"auto" | "path"``, ``list of str``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(code(repr(value).replace("'", '"')) for value in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        named = [type_name(arg) for arg in args if arg is not type(None)]
        return " or ".join(named) + (" or none" if type(None) in args else "")
    if origin is tuple:
        return f"list of {type_name(typing.get_args(annotation)[0])}"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(code(str(member.value)) for member in annotation)
    if annotation is SecretStr:
        return "str (secret)"
    if annotation is Path:
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return "computed"
    if field.is_required():
        return "required"
    value = field.default
    if value is None:
        return "none"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, bool):
        return code(str(value).lower())
    if isinstance(value, int) and value >= MIB and value % MIB == 0:
        return f"{code(str(value))} ({_binary_size(value)})"
    if isinstance(value, str | Path | list):
        return code(repr(value).replace("'", '"') if not isinstance(value, Path) else str(value))
    return code(str(value))


def _binary_size(value: int) -> str:
    return f"{value >> 30} GiB" if value % (1 << 30) == 0 else f"{value >> 20} MiB"


_BOUNDS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "at least", "max_length": "at most"}


def _constraints(field: FieldInfo) -> str:
    parts = []
    for item in field.metadata:
        for attribute, symbol in _BOUNDS.items():
            bound = getattr(item, attribute, None)
            if bound is not None:
                unit = " items" if attribute == "min_length" and field.annotation is not str else ""
                parts.append(f"{symbol} {bound}{unit}")
    return ", ".join(parts)


def _is_section(field: FieldInfo) -> bool:
    return isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)


def _doc(model: type[BaseModel]) -> str:
    return (model.__doc__ or "").strip().split("\n\n", 1)[0]
