"""A report as blocks — headings, paragraphs, tables, lists, code, figures — and its two renderings, drawn from the
same blocks: Markdown (report.md, compat.md) and one self-contained HTML page (report.html; figures there only).
Text inside blocks may use four inline marks: ``**bold**``, ```code```, ``[text](#anchor)`` and ``mark(...)``,
which the page draws as inline SVG, never emoji (docs/report.md: issue 26).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Heading:
    level: int
    text: str
    anchor: str | None = None  # the page's id for it, for links (written in anchor_id's shape, whatever is given)
    style: str = ""  # a class the page styles it by
    page_only: bool = False  # a heading of figures: Markdown has none to show


@dataclass(frozen=True)
class Paragraph:
    text: str
    style: str = ""  # "verdict", "warning", "meta": how the page shows it


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]
    # The page folds it away under this summary (Markdown shows it whole).
    folded: str | None = None
    # Cells whose text the page colours by status (passed, FAILED, inconclusive): their column.
    status_column: int | None = None


@dataclass(frozen=True)
class Item:
    text: str
    children: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Bullets:
    items: list[Item]


@dataclass(frozen=True)
class Code:
    lines: list[str]


@dataclass(frozen=True)
class Figure:
    """A plot: ``draw`` makes it (a PNG data URI), or None when there is nothing to plot."""

    figure_id: str
    title: str
    draw: Callable[[], str | None]


Block = Heading | Paragraph | Table | Bullets | Code | Figure


def bullets(*texts: str) -> Bullets:
    return Bullets([Item(t) for t in texts])


# A status mark: the word Markdown writes, and the shape the page draws (16×16, one colour and white).
_SHAPES = {
    "passed": ("#1a7f37", "<circle cx='8' cy='8' r='7.5'/><path d='M4.5 8.3l2.4 2.4 4.6-4.9' fill='none' "
                          "stroke='#fff' stroke-width='2'/>"),
    "FAILED": ("#cf222e", "<circle cx='8' cy='8' r='7.5'/><path d='M5.2 5.2l5.6 5.6M10.8 5.2l-5.6 5.6' "
                          "stroke='#fff' stroke-width='2'/>"),
    "condition": ("#9a6700", "<path d='M8 .8L15.6 14.8H.4z'/><path d='M8 5.6v4.4M8 11.4v1.8' stroke='#fff' "
                             "stroke-width='1.8'/>"),
    "incomplete": ("#8250df", "<circle cx='8' cy='8' r='7.5'/><path d='M4.5 8h7' stroke='#fff' stroke-width='2'/>"),
}
MARKS = tuple(_SHAPES)
_MARK = re.compile(r"\[\[mark:(" + "|".join(MARKS) + r")\]\]")
WARNING_SIGN = "⚠"  # in gate text (results.GateResult.measured_text): the page draws it as the condition mark


def mark(kind: str) -> str:
    """A status mark (one of MARKS) to put in a block's text."""
    if kind not in _SHAPES:
        raise ValueError(f"unknown mark {kind!r} (expected one of {list(MARKS)})")
    return f"[[mark:{kind}]]"


def _svg(kind: str) -> str:
    colour, shape = _SHAPES[kind]
    return (f"<svg class='mark' viewBox='0 0 16 16' width='14' height='14' role='img' aria-label='{kind}' "
            f"fill='{colour}'><title>{kind}</title>{shape}</svg>")


# -- Markdown ------------------------------------------------------------------------

_LINK = re.compile(r"\[([^\]]+)\]\(#[^)]*\)")


def to_markdown(blocks: list[Block]) -> str:
    """report.md is posted as a CI step summary or a pull-request comment: what it quotes (an exception's
    message, a test id, a model's description) must stay text. So every block's text is one line with
    nothing that starts a block, a tag or a link of its own (``_md``), and a code block's fence is longer
    than any run of backticks in it."""
    lines: list[str] = []
    for block in blocks:
        if isinstance(block, Heading) and not block.page_only:
            lines += ["#" * block.level + " " + _md(block.text), ""]
        elif isinstance(block, Paragraph):
            lines += [_md(block.text), ""]
        elif isinstance(block, Table):
            lines += markdown_table(block.header, block.rows) + [""]
        elif isinstance(block, Bullets):
            for item in block.items:
                lines.append(f"- {_md(item.text)}")
                lines += [f"  - {_md(child)}" for child in item.children]
            lines.append("")
        elif isinstance(block, Code):
            fence = "`" * max(3, _longest_backtick_run("\n".join(block.lines)) + 1)
            lines += [fence, *block.lines, fence, ""]
    return "\n".join(lines)


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    def cell(value: str) -> str:
        return _md(str(value)).replace("|", "\\|")

    return ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(cell(c) for c in row) + " |" for row in rows)]


def code_span(text: str) -> str:
    """``text`` as inline code, whatever backticks it holds: fenced by one more backtick than its longest
    run (CommonMark), padded with a space where it starts or ends with one. Both renderers read it."""
    text = " ".join(str(text).splitlines())
    fence = "`" * (_longest_backtick_run(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _longest_backtick_run(text: str) -> int:
    return max((len(run) for run in re.findall(r"`+", text)), default=0)


# An inline code span: a run of backticks, then the same run again, neither touching another backtick.
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
# What would make quoted text Markdown of its own: a tag or an autolink (<script>, <!--, <http://…>),
# a link or image ([text](url), ![alt](url)) — the report's own links are gone by then (_LINK).
_RAW_HTML = re.compile(r"<(?=[A-Za-z/!?])")
_FOREIGN_LINK = re.compile(r"(!?)\[(?=[^\]]*\]\()")
# A line that starts a block: a heading, a quote, a table row, a list item, a rule.
_BLOCK_START = re.compile(r"^(\s*)(#{1,6}(?=\s|$)|>|\|(?=.*\|)|[-+*](?=\s)|\d+[.)](?=\s|$)"
                          r"|[-*_](?=(?:\s*[-*_]){2,}\s*$))")


def _md(text: str) -> str:
    """One block's text as Markdown: the report's own marks rendered, what it quotes left as text."""
    text = _MARK.sub(r"[\1]", _LINK.sub(r"\1", " ".join(str(text).splitlines())))
    parts, last = [], 0
    for span in _CODE_SPAN.finditer(text):  # a code span shows its text as it is: nothing to escape there
        parts += [_escape(text[last:span.start()]), span.group(0)]
        last = span.end()
    parts.append(_escape(text[last:]))
    shown = "".join(parts)
    return _BLOCK_START.sub(_escape_block_start, shown, count=1)


def _escape_block_start(found: re.Match[str]) -> str:
    marker = found[2]
    if marker[0].isdigit():  # "1." starts a list; "1\." does not ("\1" would show its backslash)
        return found[1] + marker[:-1] + "\\" + marker[-1]
    return found[1] + "\\" + marker


def _escape(text: str) -> str:
    return _FOREIGN_LINK.sub(r"\1\\[", _RAW_HTML.sub(r"\\<", text))


# -- HTML ----------------------------------------------------------------------------

_BOLD = re.compile(r"\*\*(.+?)\*\*")
_HTML_LINK = re.compile(r"\[([^\]]+)\]\((#[^)]*)\)")
STATUS_CLASS = {"passed": "pass", "FAILED": "fail", "inconclusive": "unsure", "incomplete": "missing",
                "not comparable": "aside", "blocked": "aside"}


def to_html(blocks: list[Block], title: str) -> str:
    body: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            attributes = (f" id='{anchor_id(block.anchor)}'" if block.anchor else "") + (
                f" class='{html.escape(block.style, quote=True)}'" if block.style else "")
            body.append(f"<h{block.level}{attributes}>{inline(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            attributes = f" class='{html.escape(block.style, quote=True)}'" if block.style else ""
            body.append(f"<p{attributes}>{inline(block.text)}</p>")
        elif isinstance(block, Table):
            table = _html_table(block)
            body += [f"<details><summary>{inline(block.folded)}</summary>", *table, "</details>"] if block.folded \
                else table
        elif isinstance(block, Bullets):
            body.append("<ul>")
            for item in block.items:
                children = "".join(f"<li>{inline(child)}</li>" for child in item.children)
                body.append(f"<li>{inline(item.text)}" + (f"<ul>{children}</ul>" if children else "") + "</li>")
            body.append("</ul>")
        elif isinstance(block, Code):
            body.append(f"<pre>{html.escape(chr(10).join(block.lines))}</pre>")
        elif isinstance(block, Figure):
            png = block.draw()
            if png is not None:
                alt = _md(block.title).replace(WARNING_SIGN + "\ufe0f", WARNING_SIGN).replace(WARNING_SIGN, "warning:")
                body.append(f"<figure id='{anchor_id(block.figure_id)}'><img alt='{html.escape(alt, quote=True)}' "
                            f"src='{png}'><figcaption>{inline(block.title)}</figcaption></figure>")
    return PAGE.format(title=html.escape(title), body="\n".join(body))


def _html_table(table: Table) -> list[str]:
    # In a box of the page's width that scrolls sideways: a wide table (the scan's) never widens the page.
    lines = ["<div class='wide'><table><thead><tr>" + "".join(f"<th>{inline(h)}</th>" for h in table.header)
             + "</tr></thead><tbody>"]
    for row in table.rows:
        cells = []
        for index, value in enumerate(row):
            shown = inline(str(value))
            if index == table.status_column and str(value) in STATUS_CLASS:
                shown = f"<span class='{STATUS_CLASS[str(value)]}'>{shown}</span>"
            cells.append(f"<td>{shown}</td>")
        lines.append("<tr>" + "".join(cells) + "</tr>")
    lines.append("</tbody></table></div>")
    return lines


def inline(text: str) -> str:
    """Escaped text with the three inline marks as HTML."""
    shown = html.escape(text, quote=True)
    shown = _CODE_SPAN.sub(lambda found: f"<code>{_code_text(found[2])}</code>", shown)
    shown = _BOLD.sub(r"<b>\1</b>", shown)
    shown = _MARK.sub(lambda found: _svg(found[1]), shown)
    shown = shown.replace(WARNING_SIGN + "\ufe0f", WARNING_SIGN).replace(WARNING_SIGN, _svg("condition"))
    # A link's target is an id of the page: written in anchor_id's shape, as the id it points at is.
    return _HTML_LINK.sub(lambda found: f"<a href='#{anchor_id(html.unescape(found[2][1:]))}'>{found[1]}</a>", shown)


def _code_text(text: str) -> str:
    # CommonMark: one space either side is the fence's padding (code_span adds it beside a backtick).
    return text[1:-1] if len(text) > 2 and text.startswith(" ") and text.endswith(" ") else text


def anchor_id(text: str) -> str:
    """A page id made of the name: letters, digits, '-' and '_', every other character a '-'. Every id the page
    writes goes through it (a heading's, a figure's), so no name a model brings reaches an attribute as it is
    (issue 61, N13: a method's ``'`` ended the id and began a tag)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", text)


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #1f2328; }}
.verdict {{ color: #fff; font-size: 1.8em; font-weight: 700; padding: .4em .8em; border-radius: 6px;
  display: inline-block; background: #57606a; }}
.verdict.go {{ background: #1a7f37; }} .verdict.conditions {{ background: #9a6700; }}
.verdict.nogo {{ background: #cf222e; }} .verdict.incomplete {{ background: #8250df; }}
.wide {{ max-width: 100%; overflow-x: auto; }}
table {{ border-collapse: collapse; margin: .6em 0; font-size: 12px; }}
th, td {{ border: 1px solid #d0d7de; padding: 3px 6px; text-align: left; vertical-align: top; }}
td code {{ overflow-wrap: anywhere; }}
svg.mark {{ vertical-align: -2px; }}
th {{ background: #f6f8fa; }}
pre {{ background: #f6f8fa; padding: .6em; overflow-x: auto; font-size: 12px; }}
.pass {{ color: #1a7f37; }} .fail {{ color: #cf222e; font-weight: 700; }} .unsure {{ color: #9a6700; }}
.missing {{ color: #8250df; font-weight: 700; }} .aside {{ color: #57606a; }}
.warning {{ color: #9a6700; }} .meta {{ color: #57606a; }}
figure {{ margin: 1em 0; }} figure img {{ max-width: 100%; }} figcaption {{ color: #57606a; }}
h3 {{ border-top: 1px solid #d0d7de; padding-top: 1em; margin-top: 1.5em; }}
</style></head>
<body>
{body}
</body></html>
"""
