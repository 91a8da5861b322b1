// A tool call as a card: input (a diff for write_file/patch_file, the command for shell),
// status, result, duration and exit code.

import { h, clear, fmtInt, fmtMs, withCopy } from "../dom.js";

// While the model writes a call's input, the card shows its last characters only, drawn at
// most once a frame: a 2,500-line write_file comes in some 10,000 pieces, and drawing all of
// it at each one took minutes. The whole input replaces it once the model has written it.
const PARTIAL_TAIL = 1000;

// A failed call's state, in words (the keys are tool.failed's error_class), as the terminal app
// says it (docs/tui.md). A call that was stopped rather than failed is not red.
const FAILED_BECAUSE = {
  user_denied: "denied",
  cancelled: "cancelled",
  timeout: "timed out",
  confirmation_timeout: "not answered in time",
  policy_denied: "refused by policy",
};

// A failed call's state in words, for its card and its row in the trace.
export function toolFailure(errorClass) {
  return FAILED_BECAUSE[errorClass] || "failed";
}
const STOPPED = new Set(["cancelled", "interrupted"]);
// The result the daemon stores, when it starts again, for a call it was killed under (there
// is no tool.failed for it): metis/core/tools/results.py INTERRUPTED.
const INTERRUPTED = "Tool call interrupted:";

// A text's lines: the newline that ends its last line starts no line of its own ("one\ntwo\n"
// is two lines, "" none).
function linesOf(text) {
  return text === "" ? [] : text.replace(/\n$/, "").split("\n");
}

export function diffView(name, input) {
  if (!input || typeof input !== "object") return null;
  const lines = [];
  if (name === "write_file" && typeof input.content === "string") {
    lines.push(["meta", `+++ ${input.path}`]);
    for (const l of linesOf(input.content)) lines.push(["add", `+${l}`]);
  } else if (name === "patch_file" && typeof input.old_text === "string") {
    lines.push(["meta", `--- ${input.path}`], ["meta", `+++ ${input.path}`]);
    for (const l of linesOf(input.old_text)) lines.push(["del", `-${l}`]);
    for (const l of linesOf(String(input.new_text ?? ""))) lines.push(["add", `+${l}`]);
  } else {
    return null;
  }
  return h("pre", { class: "diff", "aria-label": `Changes to ${input.path}` },
    lines.map(([kind, text]) => h("span", { class: `d-${kind}` }, text, "\n")));
}

function inputView(name, input) {
  const diff = diffView(name, input);
  if (diff) return diff;
  if (name === "shell" && input && typeof input.command === "string") {
    const command = h("pre", { class: "command" }, h("span", { class: "prompt", "aria-hidden": "true" }, "$ "), input.command);
    return withCopy(command, "command", () => input.command);
  }
  return h("pre", { class: "json" }, JSON.stringify(input, null, 2));
}

export function toolCard(toolUseId, name) {
  const nameEl = h("span", { class: "tool-name" }, name || "tool");
  // asked for by the model, not yet running: the calls of a reply run one after another, so a
  // call waits while one before it waits for an answer
  const status = h("span", { class: "badge tool-status", title: "Runs after the tool calls before it" }, "queued");
  const duration = h("span", { class: "muted small tool-duration" });
  const exit = h("span", { class: "badge exit", hidden: true });
  const inputBox = h("div", { class: "tool-input" });
  const resultBox = h("div", { class: "tool-result", hidden: true });
  const el = h("details", { class: "tool-card", open: true, dataset: { toolUseId } },
    h("summary", {}, h("span", { class: "tool-icon", "aria-hidden": "true" }, "⚙"), nameEl, status, exit, duration),
    inputBox, resultBox);
  let outcome = false; // a tool.completed or tool.failed said how the call ended
  let partial = "";
  let drawFrame = null;
  let drawTimer = null;
  function stopDrawing() {
    cancelAnimationFrame(drawFrame);
    clearTimeout(drawTimer);
    drawFrame = drawTimer = null;
  }
  function drawPartial() {
    stopDrawing();
    let cut = Math.max(0, partial.length - PARTIAL_TAIL);
    if (cut && /[\udc00-\udfff]/.test(partial[cut])) cut += 1; // not half a character
    const pre = h("pre", { class: "json partial" },
      cut ? h("span", { class: "muted" }, `… ${fmtInt(cut)} characters before\n`) : null,
      partial.slice(cut));
    clear(inputBox).append(pre);
    pre.scrollTop = pre.scrollHeight; // the newest characters
  }
  const c = {
    el,
    input: undefined,
    setInput(value) {
      c.input = value;
      if (value === undefined) return;
      stopDrawing();
      partial = "";
      clear(inputBox).append(inputView(nameEl.textContent, value));
    },
    // pieces wait until the next frame (or 100 ms, when frames do not run in a hidden tab)
    appendInput(piece) {
      partial += piece;
      if (drawFrame !== null) return;
      drawFrame = requestAnimationFrame(drawPartial);
      drawTimer = setTimeout(drawPartial, 100);
    },
    setStatus(s) {
      status.textContent = s;
      status.removeAttribute("title");
      status.className = `badge tool-status s-${s.replace(/\s+/g, "-")}`;
      el.classList.toggle("is-stopped", STOPPED.has(s));
    },
    setOutcome(type, p) {
      if (p.tool_name) nameEl.textContent = p.tool_name;
      duration.textContent = fmtMs(p.duration_ms);
      outcome = true;
      if (type === "tool.failed") {
        c.setStatus(toolFailure(p.error_class));
        if (!resultBox.childElementCount) c.setResult({ is_error: true, content: [{ type: "text", text: p.message || p.error_class }] });
      } else {
        c.setStatus(p.is_error ? "error" : "done");
      }
      if (p.exit_code !== null && p.exit_code !== undefined) showExit(p.exit_code);
    },
    setResult(block) {
      let text = (block.content || []).map((b) => (b.type === "text" ? b.text : "[image]")).join("\n");
      // a shell result begins "exit_code: N": the badge says it, the output is the rest
      const code = /^exit_code: (-?\d+)\n?/.exec(text);
      if (code) {
        showExit(Number(code[1]));
        text = text.slice(code[0].length);
      }
      // killed under, the call has no outcome of its own but this result
      if (!outcome && block.is_error && text.startsWith(INTERRUPTED)) c.setStatus("interrupted");
      resultBox.hidden = false;
      el.classList.toggle("is-error", !!block.is_error);
      const output = withCopy(h("pre", { class: "output" }, text), "output", () => text);
      clear(resultBox).append(h("div", { class: "small muted" }, block.is_error ? "Error" : "Result"), output);
    },
  };
  function showExit(code) {
    exit.hidden = false;
    exit.textContent = `exit ${code}`;
    exit.className = `badge exit ${code === 0 ? "ok" : "bad"}`;
  }
  return c;
}
