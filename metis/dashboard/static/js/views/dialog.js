// A modal confirmation on <dialog> (focus trapped by the browser, Esc cancels).

import { h } from "../dom.js";

export function confirmDialog(title, text, action) {
  return new Promise((resolve) => {
    const dlg = h("dialog", { class: "confirm", "aria-labelledby": "dlg-title" },
      h("h2", { id: "dlg-title" }, title),
      h("p", {}, text),
      h("div", { class: "row" },
        h("button", { type: "button", value: "cancel", class: "cancel", onclick: () => dlg.close("cancel") }, "Cancel"),
        h("button", { type: "button", value: "ok", class: "danger", onclick: () => dlg.close("ok") }, action)));
    dlg.addEventListener("close", () => {
      dlg.remove();
      resolve(dlg.returnValue === "ok");
    });
    document.body.append(dlg);
    dlg.showModal();
    dlg.querySelector("button.cancel").focus();
  });
}
