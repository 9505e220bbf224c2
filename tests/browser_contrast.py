"""Text contrast measured in a real browser page, for the browser tests (no test here)."""

# Contrast of every visible piece of text inside the elements matching a selector, from the
# computed styles: its colour (SVG text: its fill) over the background it sits on (the nearest
# opaque background of its ancestors, with translucent layers blended in), WCAG 2 formula.
JS_CONTRAST = """(selector) => {
  const parse = (c) => {
    const m = c && c.match(/rgba?\\(([^)]+)\\)/);
    if (!m) return null;
    const p = m[1].split(',').map(parseFloat);
    return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1};
  };
  const over = (top, bottom) => ({r: top.r * top.a + bottom.r * (1 - top.a), g: top.g * top.a + bottom.g * (1 - top.a),
                                   b: top.b * top.a + bottom.b * (1 - top.a), a: 1});
  const background = (el) => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c.a > 0) { layers.push(c); if (c.a >= 1) break; }
    }
    let bg = {r: 255, g: 255, b: 255, a: 1};
    for (let i = layers.length - 1; i >= 0; i--) bg = over(layers[i], bg);
    return bg;
  };
  const lum = (c) => {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b);
  };
  const out = [];
  for (const root of document.querySelectorAll(selector)) {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    let node;
    while ((node = walker.nextNode())) {
      const text = node.textContent.trim();
      const el = node.parentElement;
      if (!text || !el || el.closest('title, style, script') || el.getClientRects().length === 0) continue;
      const cs = getComputedStyle(el);
      if (cs.visibility === 'hidden' || parseFloat(cs.opacity) === 0) continue;
      const bg = background(el);
      let fg = parse(el instanceof SVGElement ? cs.fill : cs.color);
      if (!fg) continue;
      fg = over(fg, bg);
      const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
      out.push({text: text.slice(0, 50), ratio: (hi + 0.05) / (lo + 0.05), color: cs.color,
                background: `rgb(${Math.round(bg.r)},${Math.round(bg.g)},${Math.round(bg.b)})`,
                where: (el.className && el.className.baseVal !== undefined ? el.className.baseVal : el.className)
                       || el.tagName});
    }
  }
  return out;
}"""


def low_contrast(page, selector: str, minimum: float = 4.5) -> tuple[list[dict], int]:
    """(texts under ``minimum``:1 inside ``selector``, the number of texts measured)."""
    measured = page.evaluate(JS_CONTRAST, selector)
    return sorted((m for m in measured if m["ratio"] < minimum), key=lambda m: m["ratio"]), len(measured)
