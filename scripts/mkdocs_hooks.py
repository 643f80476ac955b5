"""MkDocs hooks of the documentation site (mkdocs.yml names this file).

The HTTP API reference (docs/reference/http.md) is the OpenAPI document of
``delayq serve`` rendered as Markdown at build time: the page's ``<!-- openapi -->``
marker is replaced by every operation (parameters, body, answers) and every schema,
so the site shows what the server serves, with no script and nothing fetched.

The docstrings are written for ``help()`` and Sphinx, with roles (``:meth:`put```,
``:class:`~delayq.Retry```) that MkDocs does not know: :func:`on_page_content` turns
each into code, linked when it names an object of the site. The command line's
reference shows the default of an option that has none (a flag, a repeatable option)
as click's ``Sentinel.UNSET``: it shows a dash instead. A signature's default that is
one of delayq's constants (``queue: str = DEFAULT_QUEUE_NAME``) shows its value.

Material's offline plugin adds a script from a CDN to every page (a shim that runs
the search from file://); :func:`on_config` takes every script that is not the
site's own back out, so that viewing the site fetches nothing (from file:// the
search box then finds nothing; served over HTTP it works).
"""

from __future__ import annotations

import importlib
import re
from html import escape
from typing import Any

from mkdocs.plugins import event_priority

MARKER = "<!-- openapi -->"
HTTP_PAGE = "reference/http.md"
METHODS = ("get", "head", "post", "put", "patch", "delete")
#: A Sphinx role as Markdown renders it: ``:meth:<code>~delayq.Queue.put</code>``, or
#: with a title of its own: ``:attr:<code>title &lt;delayq.Handle.due_at&gt;</code>``.
ROLE = re.compile(
    r":(?:meth|func|class|attr|exc|data|mod|obj):<code>"
    r"(?:([^<&]+?) &lt;([\w.]+)&gt;|(~?)([\w.]+)(\(\))?)</code>"
)
#: A name in a highlighted signature (Pygments' ``n`` class): a constant's, maybe.
CONSTANT = re.compile(r'<span class="n">([A-Z][A-Z0-9_]+)</span>')
#: The modules of delayq's constants, whose values stand for their names.
CONSTANT_MODULES = (
    "delayq.durable.constants",
    "delayq.runtime.constants",
    "delayq.inproc._constants",
    "delayq.server._constants",
)
#: An option's default cell in the command line's reference, when it has none.
NO_DEFAULT = re.compile(r"<td>(?:<code>)?(?:Sentinel\.UNSET|None)(?:</code>)?</td>")


@event_priority(-100)  # after the offline plugin's on_config
def on_config(config: Any, **_: Any) -> Any:
    """Keep only the site's own scripts: nothing is loaded from another host."""
    polyfills = config.extra.get("polyfills", [])
    config.extra["polyfills"] = [url for url in polyfills if "://" not in str(url)]
    return config


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Render the OpenAPI document into the HTTP reference page."""
    if page.file.src_uri != HTTP_PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{HTTP_PAGE} lost its {MARKER} marker")
    return markdown.replace(MARKER, render(openapi_document()))


def on_page_content(html: str, **_: Any) -> str:
    """Sphinx roles as code (linked by autorefs when the object is on the site), a
    dash for an option without a default, constants' values in signatures."""
    return CONSTANT.sub(_constant, NO_DEFAULT.sub("<td>-</td>", ROLE.sub(_role, html)))


def _constant(match: re.Match[str]) -> str:
    for module in CONSTANT_MODULES:
        value = vars(importlib.import_module(module)).get(match[1])
        if isinstance(value, str):  # as the signatures' own literals: "ignore"
            return f'<span class="s2">"{escape(value)}"</span>'
        if isinstance(value, (int, float)):
            return f'<span class="mi">{value!r}</span>'
    return match[0]


def _role(match: re.Match[str]) -> str:
    title, titled, short, target, call = match.groups()
    if titled:
        shown, target = title, titled
    else:
        shown = (target.rsplit(".", 1)[-1] if short else target) + (call or "")
    if "." not in target:  # a name relative to the docstring's object: no link
        return f"<code>{shown}</code>"
    return f'<autoref identifier="{target}" optional><code>{shown}</code></autoref>'


def openapi_document() -> dict[str, Any]:
    """The document a server serves at /openapi.json (the same whatever its flags)."""
    from delayq.server import ServeConfig, create_app  # noqa: PLC0415 (build time only)

    document: dict[str, Any] = create_app(
        ServeConfig(url="memory://openapi-reference", dispatch=False)
    ).openapi()
    return document


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _type(schema: dict[str, Any]) -> str:
    """A schema's type in a few words: ``string``, ``integer or null``, a link..."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#schema-{name.lower()})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_type(part) for part in schema[key])
    if "enum" in schema:
        return "one of " + ", ".join(f"`{value}`" for value in schema["enum"])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    return str(kind)


def _operation(path: str, method: str, operation: dict[str, Any]) -> list[str]:
    name = operation.get("operationId", "")
    lines = [f"### `{method.upper()} {path}` {{#op-{name.lower()}}}", ""]
    lines += [f"`{name}`: {operation.get('summary', '')}", ""]
    if operation.get("description"):
        lines += [operation["description"].strip(), ""]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for parameter in parameters:
            schema = parameter.get("schema", {})
            description = parameter.get("description", schema.get("description", ""))
            lines.append(
                f"| `{parameter['name']}` | {parameter['in']} | {_type(schema)} "
                f"| {'yes' if parameter.get('required') else 'no'} | {_cell(description)} |"
            )
        lines.append("")
    body = operation.get("requestBody")
    if body:
        schema = body.get("content", {}).get("application/json", {}).get("schema", {})
        lines += [f"Body (`application/json`): {_type(schema)}", ""]
    lines += ["| status | answer | description |", "|---|---|---|"]
    for status, answer in operation.get("responses", {}).items():
        content = answer.get("content", {})
        shown = next(iter(content.items()), None)
        kind = f"`{shown[0]}` {_type(shown[1].get('schema', {}))}" if shown else "-"
        lines.append(f"| {status} | {kind} | {_cell(answer.get('description', ''))} |")
    return [*lines, ""]


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name} {{#schema-{name.lower()}}}", ""]
    if schema.get("description"):
        lines += [schema["description"].strip(), ""]
    properties = schema.get("properties", {})
    if not properties:
        return [*lines, f"Type: {_type(schema)}", ""]
    required = set(schema.get("required", []))
    lines += ["| field | type | required | description |", "|---|---|---|---|"]
    for field, spec in properties.items():
        lines.append(
            f"| `{field}` | {_type(spec)} | {'yes' if field in required else 'no'} "
            f"| {_cell(spec.get('description', ''))} |"
        )
    return [*lines, ""]


def render(document: dict[str, Any]) -> str:
    """The operations, then the schemas, of an OpenAPI document as Markdown."""
    info = document["info"]
    lines = [f"OpenAPI {document['openapi']}, {info['title']} {info['version']}.", ""]
    lines += [info.get("description", "").strip(), "", "## Operations", ""]
    for path, item in document["paths"].items():
        for method in METHODS:
            if method in item:
                lines += _operation(path, method, item[method])
    lines += ["## Schemas", ""]
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        lines += _schema(name, schema)
    return "\n".join(lines)
