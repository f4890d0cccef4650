"""Pull metric names out of PromQL expressions (dashboards, alert rules) for the name check.

Deliberately small: strings, label matchers, ranges, numbers/durations and the label lists of
by/without/on/ignoring/group_left/group_right are stripped; what remains that is an identifier
and not a function call or keyword is a metric name. Validity of the PromQL itself is checked
separately by promtool.
"""

from __future__ import annotations

import re

KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
            "group_left", "group_right", "inf", "nan", "atan2"}
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NUMBERS = re.compile(r"(?<![A-Za-z_:])\d+(\.\d+)?([eE][+-]?\d+)?(ms|s|m|h|d|w|y)?")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(.*),)?\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$", re.S)


def metric_names(expr: str) -> set[str]:
    s = _STRINGS.sub('""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = _LABEL_LISTS.sub(" ", s)
    s = _NUMBERS.sub(" ", s)
    names = set()
    for m in _IDENT.finditer(s):
        rest = s[m.end():].lstrip()
        if rest.startswith("("):
            continue  # function call (or aggregation)
        if m.group(0) in KEYWORDS or m.group(0).startswith("$"):
            continue
        names.add(m.group(0))
    return names


def variable_query_selector(query: str) -> str | None:
    """The series selector inside a Grafana `label_values(selector, label)` variable query."""
    m = _LABEL_VALUES.match(query)
    if not m:
        raise ValueError(f"unsupported variable query: {query!r}")
    return m.group(1)
