"""What the report's readers see: a page opened in Debian's headless Chromium (driven by
Playwright, which downloads no browser of its own), and junit.xml as a CI system reads it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lxml import etree

from upgrade_gate.schema.reader import Reader
from upgrade_gate.schema.verdict import VerdictRecord

CHROMIUM = "/usr/bin/chromium"
JUNIT_SCHEMA = Path(__file__).parents[1] / "data" / "junit.xsd"
# Without the background-networking flags Chromium keeps calling Google's hosts,
# which this closed network refuses.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@dataclass
class Rendered:
    verdict: str
    images: list[tuple[str, str, int, int]]  # the figure's id, alt text, natural width and height
    console_errors: list[str]
    requests: list[str]  # every URL the page asked for beyond itself
    screenshot: Path
    page_width: int = 0  # the document's scroll width, in CSS pixels (the viewport is 1280)
    marks: list[tuple[str, float, float]] | None = None  # each drawn status mark: its label, width and height


def render(page_file: Path, screenshot: Path) -> Rendered:
    assert Path(CHROMIUM).is_file(), f"{CHROMIUM} missing: the README's test command installs Debian's chromium"
    from playwright.sync_api import sync_playwright  # the browser tier's alone: not imported at collection

    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("request", lambda request: requests.append(request.url))
            page.goto(page_file.resolve().as_uri(), wait_until="load")
            verdict = page.locator("#verdict").inner_text()
            images = page.evaluate("Array.from(document.images).map("
                                   "i => [i.closest('figure')?.id ?? '', i.alt, i.naturalWidth, i.naturalHeight])")
            page_width = page.evaluate("document.documentElement.scrollWidth")
            marks = page.evaluate("Array.from(document.querySelectorAll('svg.mark')).map("
                                  "m => [m.getAttribute('aria-label'), m.getBoundingClientRect().width, "
                                  "m.getBoundingClientRect().height])")
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    own = page_file.resolve().as_uri()
    return Rendered(verdict, [tuple(i) for i in images], errors,
                    [url for url in requests if url != own and not url.startswith("data:")], screenshot,
                    page_width, [tuple(m) for m in marks])


def colours(png: Path) -> int:
    """How many distinct colours a screenshot has (a blank page has one)."""
    from PIL import Image  # comes with matplotlib

    with Image.open(png) as image:
        found = image.convert("RGB").getcolors(maxcolors=1 << 20)
    return len(found) if found is not None else 1 << 20


def validate_junit(path: Path) -> etree._ElementTree:
    tree = etree.parse(str(path))
    schema = etree.XMLSchema(etree.parse(str(JUNIT_SCHEMA)))
    assert schema.validate(tree), schema.error_log
    return tree


def verdict_of(out: Path, name: str = "verdict.json") -> VerdictRecord:
    """verdict.json (or compat.json) as a tool reads it: the typed verdict record."""
    return VerdictRecord.from_reader(Reader(json.loads((out / name).read_text()), name))
