// A label picker that searches: a text box that narrows the task's labels as one types (a substring of
// the label or its word, any case), arrows to move, Enter to pick. A task of 150 intents cannot be read
// as 150 buttons or a 150-entry select. WAI-ARIA combobox pattern: the box is a combobox, the list a
// listbox of options, the option under the arrows its aria-activedescendant.
//
// Where several labels match what was typed and the arrows have not chosen one, the first Enter asks
// ("lost" matches lost_luggage and report_lost_card: Enter again picks the first), and the second picks;
// a label typed whole, a single match or a choice made with the arrows or the mouse is picked at once.

import { el, wordSaysMore } from "./util.js";

let pickers = 0; // for ids unique in the page

// `labels`: the task's {label: word}; `name`: the box's accessible name when no <label> names it;
// `onPick(label)`: called when a label is picked (by Enter or a click); `exclude`: labels not offered.
export class LabelPicker {
  constructor({ id, name, placeholder = "type to find a label", onPick = () => {}, exclude = [], disabled = false } = {}) {
    const key = `label-picker-${++pickers}`;
    this.onPick = onPick;
    this.exclude = new Set(exclude);
    this.labels = {};
    this.value = ""; // the label picked; "" until one is
    this.matches = [];
    this.active = -1;
    this.chosen = false; // the arrows moved since the last keystroke: Enter picks what they chose
    this.asking = false; // Enter was pressed once over several matches: the next picks
    this.list = el("ul", { id: `${key}-options`, role: "listbox", class: "picker-options", "aria-label": name ? `${name}: labels` : "Labels", hidden: true });
    this.count = el("span", { class: "visually-hidden", role: "status", "aria-live": "polite" });
    this.question = el("p", { class: "picker-ask", hidden: true });
    this.input = el("input", {
      id: id ?? key,
      type: "text",
      role: "combobox",
      autocomplete: "off",
      spellcheck: "false",
      placeholder,
      disabled,
      "aria-label": name,
      "aria-autocomplete": "list",
      "aria-expanded": "false",
      "aria-controls": this.list.id,
    });
    this.node = el("div", { class: "picker" }, this.input, this.question, this.list, this.count);
    // A press in the list (an option, its scroll bar) leaves the focus in the box, whose blur would close it.
    this.list.addEventListener("mousedown", (event) => event.preventDefault());
    this.input.addEventListener("input", () => {
      const typed = this.input.value;
      this.value = Object.hasOwn(this.labels, typed) && !this.exclude.has(typed) ? typed : ""; // a label typed whole
      this.chosen = false;
      this.unask();
      this.open();
    });
    this.input.addEventListener("focus", () => this.open());
    this.input.addEventListener("click", () => this.open());
    this.input.addEventListener("blur", () => this.close());
    this.input.addEventListener("keydown", (event) => this.key(event));
  }

  setLabels(labels) {
    this.labels = { ...labels };
    this.clear();
  }

  clear() {
    this.value = "";
    this.input.value = "";
    this.close();
  }

  // Labels whose name or word holds the typed text, in the task's order.
  filter() {
    const query = this.input.value.trim().toLowerCase();
    return Object.entries(this.labels).filter(
      ([label, word]) => !this.exclude.has(label) && (label.toLowerCase().includes(query) || String(word).toLowerCase().includes(query)),
    );
  }

  open() {
    if (this.input.disabled) return;
    this.matches = this.filter();
    const picked = this.matches.findIndex(([label]) => label === this.value);
    this.active = this.matches.length ? Math.max(picked, 0) : -1;
    this.list.replaceChildren(
      ...this.matches.map(([label, word], index) =>
        el(
          "li",
          {
            id: `${this.list.id}-${index}`,
            role: "option",
            dataset: { label },
            onclick: () => this.pick(label),
          },
          label,
          wordSaysMore(label, word) ? el("span", { class: "muted" }, ` · ${word}`) : null,
        ),
      ),
      ...(this.matches.length ? [] : [el("li", { class: "muted picker-none", "aria-disabled": "true" }, "No label matches.")]),
    );
    this.list.hidden = false;
    this.input.setAttribute("aria-expanded", "true");
    const total = Object.keys(this.labels).filter((label) => !this.exclude.has(label)).length;
    this.count.textContent = `${this.matches.length} of ${total} labels`;
    this.highlight();
  }

  close() {
    this.unask();
    this.list.hidden = true;
    this.input.setAttribute("aria-expanded", "false");
    this.input.removeAttribute("aria-activedescendant");
    this.active = -1;
  }

  highlight() {
    for (const [index, option] of [...this.list.children].entries()) {
      option.setAttribute("aria-selected", String(index === this.active));
    }
    const option = this.active >= 0 ? this.list.children[this.active] : null;
    if (option) {
      this.input.setAttribute("aria-activedescendant", option.id);
      option.scrollIntoView({ block: "nearest" });
    } else this.input.removeAttribute("aria-activedescendant");
  }

  key(event) {
    const shown = !this.list.hidden;
    if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      if (!shown) return this.open();
      if (!this.matches.length) return;
      const step = event.key === "ArrowDown" ? 1 : -1;
      this.active = (this.active + step + this.matches.length) % this.matches.length;
      this.chosen = true;
      this.unask();
      this.highlight();
    } else if (event.key === "Enter" && shown) {
      event.preventDefault(); // Enter picks; with the list closed, it submits the form as usual
      if (this.active < 0) return;
      const [label] = this.matches[this.active];
      if (this.matches.length > 1 && !this.chosen && !this.asking && label !== this.value) return this.ask(label);
      this.pick(label);
    } else if (event.key === "Escape" && shown) {
      event.preventDefault();
      this.close();
    }
  }

  // Several labels match and none was chosen: say which Enter would pick, and what else matches.
  ask(label) {
    this.asking = true;
    const others = this.matches.length - 1;
    this.question.textContent = `${this.matches.length} labels match “${this.input.value.trim()}”: Enter again picks ${label}; ↓ ↑ choose one of the other ${others}.`;
    this.question.hidden = false;
    this.count.textContent = this.question.textContent;
  }

  unask() {
    this.asking = false;
    this.question.hidden = true;
  }

  pick(label) {
    this.value = label;
    this.input.value = label;
    this.close();
    this.onPick(label);
  }
}
