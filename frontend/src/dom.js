// A tiny element builder. Text always goes through text nodes, never innerHTML,
// so run names, input names and messages that contain HTML render as text.

/**
 * h('div', {class: 'x', dataset: {view: 'batch'}, onclick: fn}, ['text', child])
 * Attribute names come from code; values and children may be data.
 */
export function h(tag, attrs = {}, children = []) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value == null || value === false) continue;
    if (key === 'class') el.className = Array.isArray(value) ? value.filter(Boolean).join(' ') : value;
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key === 'style' && typeof value === 'object') Object.assign(el.style, value);
    else if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

/** Appends children (nodes, strings, numbers, nested arrays; null/false skipped). */
export function append(el, children) {
  if (children == null || children === false) return el;
  if (Array.isArray(children)) {
    for (const c of children) append(el, c);
  } else if (children instanceof Node) {
    el.appendChild(children);
  } else {
    el.appendChild(document.createTextNode(String(children)));
  }
  return el;
}

/** "1, 2, 3" for short lists, "1, 2, 3, … (+61 more)" for long ones. */
export function shortList(items, max = 12) {
  if (items.length <= max) return items.join(', ');
  return `${items.slice(0, max).join(', ')}, … (+${items.length - max} more)`;
}

/** A number for display: ∞ for Infinity, — for missing. */
export function fmt(v, digits = 3) {
  if (v == null || Number.isNaN(v)) return '—';
  if (v === Infinity) return '∞';
  if (v === -Infinity) return '-∞';
  return Number.isInteger(v) ? String(v) : v.toFixed(digits).replace(/\.?0+$/, '');
}
