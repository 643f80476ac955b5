"""MkDocs hooks of the documentation site (mkdocs.yml names this file).

The HTTP API reference (docs/reference/http.md) is the OpenAPI document of
``delayq serve`` rendered as Markdown at build time: the page's ``<!-- openapi -->``
marker is replaced by every operation (parameters, body, answers) and every schema,
so the site shows what the server serves, with no script and nothing fetched.

Material's offline plugin adds a script from a CDN to every page (a shim that runs
the search from file://); :func:`on_config` takes every script that is not the
site's own back out, so that viewing the site fetches nothing (from file:// the
search box then finds nothing; served over HTTP it works).
"""

from __future__ import annotations

from typing import Any

from mkdocs.plugins import event_priority

MARKER = "<!-- openapi -->"
HTTP_PAGE = "reference/http.md"
METHODS = ("get", "head", "post", "put", "patch", "delete")


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
