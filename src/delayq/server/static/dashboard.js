// The delayq dashboard: keeps the server-rendered pages fresh from the /v1 API and
// drives their buttons. No framework, no build step. Data from the API only ever
// reaches the page as text nodes or attribute values, never as HTML.
//
// With a token, it also carries the session: kept in this origin's localStorage
// (scheme, host and port), sent only in its own requests (X-Delayq-Session), never a
// cookie, which the browser would send to every port of the host.
"use strict";

(() => {
  const body = document.body;
  const page = body.dataset.page;
  const base = body.dataset.base || "";
  const refreshMs = Math.max(1000, Number(body.dataset.refreshMs) || 3000);
  const listLimit = Number(body.dataset.listLimit) || 100;
  const chartHorizon = Number(body.dataset.chartHorizon) || 3600;
  const chartBuckets = Number(body.dataset.chartBuckets) || 60;
  // Relative times are computed against the server's clock, not the browser's.
  const skewMs = (Number(body.dataset.now) || Date.now()) - Date.now();
  const serverNow = () => Date.now() + skewMs;
  const SVG = "http://www.w3.org/2000/svg";

  document.documentElement.classList.add("js");

  // -- formatting (mirrors _dashboard.py) ------------------------------------------------

  function formatDuration(seconds) {
    if (seconds < 1) return seconds > 0 ? `${Math.round(seconds * 1000)}ms` : "0s";
    let rest = Math.floor(seconds);
    const parts = [];
    for (const [size, unit] of [[86400, "d"], [3600, "h"], [60, "m"], [1, "s"]]) {
      parts.push([Math.floor(rest / size), unit]);
      rest %= size;
    }
    const first = parts.findIndex(([value]) => value > 0);
    return parts
      .slice(first, first + 2)
      .filter(([value]) => value > 0)
      .map(([value, unit]) => `${value}${unit}`)
      .join(" ");
  }

  function formatRelative(targetMs, nowMs) {
    const delta = (targetMs - nowMs) / 1000;
    if (Math.abs(delta) < 1) return "now";
    const text = formatDuration(Math.abs(delta));
    return delta > 0 ? `in ${text}` : `${text} ago`;
  }

  // Far-away times (more than RELATIVE_LIMIT_MS from now) as a date, in UTC like every
  // absolute time of the dashboard.
  const RELATIVE_LIMIT_MS = 3 * 86400 * 1000;
  const PREVIEW_CHARS = 80;
  const pad = (value, width = 2) => String(value).padStart(width, "0");

  function formatUtc(ms, seconds = true) {
    const d = new Date(ms);
    const day = `${pad(d.getUTCFullYear(), 4)}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())}`;
    const time = `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}${seconds ? `:${pad(d.getUTCSeconds())}` : ""}`;
    return `${day} ${time} UTC`;
  }

  function formatWhen(targetMs, nowMs) {
    if (Math.abs(targetMs - nowMs) >= RELATIVE_LIMIT_MS) return formatUtc(targetMs, false);
    return formatRelative(targetMs, nowMs);
  }

  function payloadPreview(msg) {
    // The API sends these fields as null on messages that do not have them.
    if (msg.payload_error !== null && msg.payload_error !== undefined) return "(cannot be shown)";
    if (msg.payload_base64 !== null && msg.payload_base64 !== undefined) {
      const encoded = msg.payload_base64;
      const padding = encoded.length - encoded.replace(/=+$/, "").length;
      return `(${Math.floor((encoded.length * 3) / 4) - padding} bytes)`;
    }
    const chars = Array.from(JSON.stringify(msg.payload));
    return chars.length <= PREVIEW_CHARS ? chars.join("") : `${chars.slice(0, PREVIEW_CHARS - 1).join("")}…`;
  }

  const iso = (ms) => new Date(ms).toISOString();

  // -- DOM helpers ------------------------------------------------------------------------

  // el("td", {class: "num"}, "3"): strings become text nodes; attributes are set as values.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined && value !== false) node.setAttribute(name, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function timeOf(ms) {
    return el("time", { datetime: iso(ms), title: formatUtc(ms), "data-due": ms }, formatWhen(ms, serverNow()));
  }

  // One path segment, encoded as the server encodes it (Python's quote(safe="")):
  // encodeURIComponent leaves !'()* as they are.
  const urlPart = (text) =>
    encodeURIComponent(text).replace(/[!'()*]/g, (ch) => `%${ch.charCodeAt(0).toString(16).toUpperCase()}`);
  const queuePath = (name) => `/v1/queues/${urlPart(name)}`;
  const isDots = (id) => id === "." || id === "..";
  // The API's message routes take the id as one path segment: no "/" (the server
  // decodes %2F before routing), and URL parsers drop "." and "..".
  const reachableByApi = (id) => !id.includes("/") && !isDots(id);
  const messagePath = (queue, id) => `${queuePath(queue)}/messages/${urlPart(id)}`;
  // The same links as message_href() in _dashboard.py.
  const messageHref = (queue, id) =>
    isDots(id)
      ? `${base}/queues/${urlPart(queue)}/message?id=${urlPart(id)}`
      : `${base}/queues/${urlPart(queue)}/messages/${urlPart(id)}`;

  function tickTimes() {
    const now = serverNow();
    for (const node of document.querySelectorAll("time[data-due]")) {
      node.textContent = formatWhen(Number(node.dataset.due), now);
    }
  }

  // -- banner and status -----------------------------------------------------------------

  const banner = document.getElementById("banner");
  const bannerText = document.getElementById("banner-text");
  const status = document.getElementById("refresh-status");

  function showError(text) {
    bannerText.textContent = text;
    banner.hidden = false;
  }

  banner.querySelector(".banner-close").addEventListener("click", () => {
    banner.hidden = true;
  });

  function setStatus(text, problem) {
    if (!status) return;
    status.textContent = text;
    status.title = problem || "";
    status.classList.toggle("failed", Boolean(problem));
  }

  // -- the session -----------------------------------------------------------------------

  const SESSION_KEY = "delayq.session";
  const SESSION_HEADER = "X-Delayq-Session";

  function storedSession() {
    try {
      return localStorage.getItem(SESSION_KEY);
    } catch (_) {
      return null;
    }
  }

  function keepSession(value) {
    try {
      localStorage.setItem(SESSION_KEY, value);
      return true;
    } catch (_) {
      return false;
    }
  }

  function forgetSession() {
    try {
      localStorage.removeItem(SESSION_KEY);
    } catch (_) {
      // No storage: nothing was kept.
    }
  }

  function withSession(headers) {
    const session = storedSession();
    if (session) headers[SESSION_HEADER] = session;
    return headers;
  }

  // A page navigated to carries no session: fetch it with the session and show it in
  // place of this one (same URL, same policy). False when the session is over.
  async function openWithSession(url) {
    const target = new URL(url, location.href);
    if (target.origin !== location.origin) return false;
    const response = await fetch(target, {
      headers: withSession({ Accept: "text/html" }),
      credentials: "same-origin",
      cache: "no-store",
    });
    if (response.status === 401) {
      forgetSession();
      return false;
    }
    if (!(response.headers.get("Content-Type") || "").startsWith("text/html")) {
      location.replace(response.url);
      return true;
    }
    const html = await response.text();
    history.replaceState(null, "", response.url);
    document.open();
    document.write(html);
    document.close();
    return true;
  }

  // The login page: straight on with a live session, else the form.
  async function startLogin() {
    const form = document.getElementById("login-form");
    const reveal = () => {
      form.hidden = false;
      form.elements.token.focus();
    };
    if (body.dataset.error || !storedSession()) {
      reveal();
      return;
    }
    try {
      if (!(await openWithSession(body.dataset.next))) reveal();
    } catch (error) {
      reveal();
      showError(`The server did not answer: ${error.message}`);
    }
  }

  // The answer of a good token: keep its session, then on to the page asked for.
  async function startSignedIn() {
    if (!keepSession(body.dataset.session)) {
      showError("This browser keeps no storage for this site, so the dashboard cannot keep its session.");
      return;
    }
    try {
      if (!(await openWithSession(body.dataset.next))) location.replace(`${base}/login`);
    } catch (error) {
      showError(`The server did not answer: ${error.message}`);
    }
  }

  // Ends the session on the server (a copy of it stops working) and here.
  async function signOut(action) {
    try {
      await fetch(action, {
        method: "POST",
        headers: withSession({ "X-Requested-With": "delayq-dashboard" }),
        credentials: "same-origin",
      });
    } catch (_) {
      // Forgotten here all the same; it expires on the server.
    } finally {
      forgetSession();
      location.replace(`${base}/login`);
    }
  }

  // -- the API ---------------------------------------------------------------------------

  async function api(method, path, payload) {
    const init = {
      method,
      credentials: "same-origin",
      headers: withSession({ "X-Requested-With": "delayq-dashboard", Accept: "application/json" }),
    };
    if (payload !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(payload);
    }
    const response = await fetch(base + path, init);
    if (response.status === 401) {
      forgetSession();
      const next = location.pathname + location.search;
      location.assign(`${base}/login?next=${urlPart(next)}`);
      throw new Error("Signed out: sign in again.");
    }
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (_) {
      data = null;
    }
    if (!response.ok) {
      const error = data && data.error;
      const failure = new Error(error ? `${error.message} (${error.code})` : `${method} ${path}: HTTP ${response.status}`);
      failure.status = response.status;
      throw failure;
    }
    return data;
  }

  // Runs `task` every refreshMs while the tab is visible; returns "refresh now".
  function autoRefresh(task) {
    let timer = null;
    let running = false;
    const schedule = () => {
      if (timer === null && !running && !document.hidden) timer = setTimeout(run, refreshMs);
    };
    async function run() {
      timer = null;
      if (document.hidden || running) return;
      running = true;
      try {
        await task();
        setStatus(`updated ${formatUtc(serverNow()).slice(11)}`);
      } catch (error) {
        setStatus("refresh failed", error.message);
      } finally {
        running = false;
        schedule();
      }
    }
    document.addEventListener("visibilitychange", () => {
      clearTimeout(timer);
      timer = null;
      if (!document.hidden) run();
    });
    schedule();
    return () => {
      clearTimeout(timer);
      timer = null;
      return run();
    };
  }

  // -- overview --------------------------------------------------------------------------

  function overviewRow(queue) {
    return el(
      "tr",
      { "data-queue": queue.name },
      el("td", {}, el("a", { href: `${base}/queues/${urlPart(queue.name)}` }, queue.name)),
      el("td", { class: "num" }, queue.scheduled),
      el("td", { class: "num" }, queue.ready),
      el("td", { class: "num" }, queue.active),
      el("td", { class: queue.dead ? "num alert" : "num" }, queue.dead),
      el("td", {}, queue.next_due_at === null ? el("span", { class: "muted" }, "—") : timeOf(queue.next_due_at)),
      el("td", { class: queue.work_lag >= 1 ? "num warn" : "num" }, ...lagCell(queue)),
    );
  }

  // The work lag, and a note when a cron tick has waited longer (_lag_cell in Python).
  function lagCell(stats) {
    const text = formatDuration(stats.work_lag);
    if (stats.lag - stats.work_lag < 1) return [text];
    const title = "A cron tick (@app.cron, @app.every) waits for a worker: no overdue work. A worker started runs it once.";
    return [`${text} `, el("span", { class: "tick-note", title }, `tick waiting ${formatDuration(stats.lag)}`)];
  }

  async function refreshOverview() {
    const data = await api("GET", "/v1/queues");
    const rows = data.queues.map(overviewRow);
    if (rows.length === 0) rows.push(el("tr", { class: "empty" }, el("td", { colspan: 7 }, "No queue holds a message yet.")));
    document.getElementById("queue-rows").replaceChildren(...rows);
    document.getElementById("first-message").hidden = data.queues.length > 0;
    document.getElementById("queue-names").replaceChildren(...data.queues.map((q) => el("option", { value: q.name })));
  }

  // -- one queue -------------------------------------------------------------------------

  function waitingRow(queue, msg) {
    const actions = el("td", { class: "actions needs-js" });
    if (!reachableByApi(msg.id)) {
      actions.append(el("span", {
        class: "muted", title: "The HTTP API cannot name this id in a URL: use the delayq command or Python.",
      }, "not over HTTP"));
    } else {
      const form = el(
        "form",
        { class: "reschedule", "data-action": "reschedule", "data-id": msg.id },
        el("input", { name: "delay", "aria-label": "New delay", placeholder: "30m", size: 5, required: true }),
        el("button", { type: "submit", class: "btn btn-small" }, "Reschedule"),
      );
      const cancel = el("button", { type: "button", class: "btn btn-small btn-danger", "data-action": "cancel", "data-id": msg.id }, "Cancel");
      actions.append(form, " ", cancel);
    }
    return el(
      "tr",
      { "data-id": msg.id },
      el("td", { class: "id" }, el("a", { href: messageHref(queue, msg.id) }, msg.id)),
      el("td", {}, el("span", { class: `badge badge-${msg.state}` }, msg.state)),
      el("td", {}, timeOf(msg.due_at)),
      el("td", { class: "num" }, `${msg.attempts} / ${msg.max_attempts}`),
      el("td", { class: "preview" }, payloadPreview(msg)),
      actions,
    );
  }

  function activeRow(queue, msg) {
    const lease = msg.lease_expires_at;
    return el(
      "tr",
      { "data-id": msg.id },
      el("td", { class: "id" }, el("a", { href: messageHref(queue, msg.id) }, msg.id)),
      el("td", { class: "num" }, `${msg.attempts} / ${msg.max_attempts}`),
      el("td", {}, lease === null || lease === undefined ? el("span", { class: "muted" }, "—") : timeOf(lease)),
    );
  }

  function deadRow(queue, msg) {
    return el(
      "tr",
      { "data-id": msg.id },
      el("td", { class: "id" }, el("a", { href: messageHref(queue, msg.id) }, msg.id)),
      el("td", { class: "error", title: msg.error_summary || "" }, msg.error_summary || "—"),
      el("td", { class: "num" }, `${msg.attempts} / ${msg.max_attempts}`),
      el(
        "td",
        { class: "actions needs-js" },
        el("button", { type: "button", class: "btn btn-small", "data-action": "retry", "data-id": msg.id }, "Retry"),
      ),
    );
  }

  // The same geometry as chart_bars() in _dashboard.py.
  function drawChart(due) {
    const width = 1000, plotTop = 18, plotHeight = 106, height = 146, gap = 3, ticks = 4;
    const counts = due.counts;
    const peak = counts.reduce((a, b) => Math.max(a, b), 0);
    const total = counts.reduce((a, b) => a + b, 0);
    const slot = width / Math.max(counts.length, 1);
    const chart = svg("svg", {
      class: "chart", id: "due-chart", viewBox: `0 0 ${width} ${height}`, role: "img",
      "aria-labelledby": "due-chart-title",
    });
    chart.append(svg("title", { id: "due-chart-title" }, `${total} messages fall due over the next hour (busiest minute: ${peak})`));
    chart.append(svg("line", { class: "axis", x1: 0, x2: width, y1: plotTop + plotHeight, y2: plotTop + plotHeight }));
    const bars = svg("g", { class: "bars" });
    counts.forEach((count, index) => {
      const barHeight = count <= 0 ? 0 : Math.max(1.5, (count / peak) * plotHeight);
      const start = due.start + index * due.bucket_ms;
      const rect = svg("rect", {
        class: "bar", x: index * slot + gap / 2, y: plotTop + plotHeight - barHeight,
        width: Math.max(slot - gap, 1), height: barHeight,
      });
      rect.append(svg("title", {}, `${count} due ${formatUtc(start)} to ${formatUtc(start + due.bucket_ms)}`));
      bars.append(rect);
    });
    chart.append(bars);
    const labels = svg("g", { class: "ticks" });
    for (let tick = 0; tick <= ticks; tick++) {
      const offset = Math.floor((counts.length * due.bucket_ms * tick) / ticks);
      const anchor = tick === 0 ? "start" : tick === ticks ? "end" : "middle";
      labels.append(svg("text", { x: (width * tick) / ticks, y: height - 4, "text-anchor": anchor },
        tick === 0 ? "now" : `+${formatDuration(offset / 1000)}`));
    }
    chart.append(labels);
    chart.append(svg("text", { class: "peak", x: 0, y: 11 }, `peak ${peak}/min`));
    document.getElementById("due-chart").replaceWith(chart);
    document.getElementById("chart-total").textContent = `${total} in the next hour`;
  }

  function setStats(stats) {
    for (const key of ["scheduled", "ready", "active", "dead"]) {
      document.querySelector(`[data-stat="${key}"]`).textContent = stats[key];
    }
    document.querySelector('[data-stat-box="dead"]').classList.toggle("stat-alert", stats.dead > 0);
    const next = document.querySelector('[data-stat="next_due_at"]');
    next.replaceChildren(stats.next_due_at === null ? "—" : timeOf(stats.next_due_at));
    document.querySelector('[data-stat="lag"]').replaceChildren(...lagCell(stats));
    document.getElementById("queue-empty").hidden = stats.scheduled + stats.ready + stats.active + stats.dead > 0;
  }

  // Rows the user is typing into are kept, so a refresh never eats their input.
  function replaceRows(tbody, rows, emptyText, columns) {
    const editing = tbody.contains(document.activeElement) && document.activeElement.tagName === "INPUT";
    if (editing) return;
    if (rows.length === 0) rows.push(el("tr", { class: "empty" }, el("td", { colspan: columns }, emptyText)));
    tbody.replaceChildren(...rows);
  }

  async function refreshQueue() {
    const queue = body.dataset.queue;
    const path = queuePath(queue);
    const [stats, waiting, active, dead, due] = await Promise.all([
      api("GET", `${path}/stats`),
      api("GET", `${path}/messages?limit=${listLimit}`),
      api("GET", `${path}/messages?state=active&limit=${listLimit}`),
      api("GET", `${path}/messages?state=dead&limit=${listLimit}`),
      api("GET", `${path}/due?horizon=${chartHorizon}&buckets=${chartBuckets}`),
    ]);
    setStats(stats);
    drawChart(due);
    const waitingRows = waiting.messages.map((m) => waitingRow(queue, m));
    replaceRows(document.getElementById("waiting-rows"), waitingRows, "Nothing waiting.", 6);
    replaceRows(document.getElementById("active-rows"), active.messages.map((m) => activeRow(queue, m)), "Nothing in flight.", 3);
    replaceRows(document.getElementById("dead-rows"), dead.messages.map((m) => deadRow(queue, m)), "No dead letters.", 4);
  }

  // -- one message -----------------------------------------------------------------------

  async function refreshMessage() {
    const queue = body.dataset.queue;
    const id = body.dataset.id;
    const shown = document.getElementById("message-state").textContent.trim();
    let state = null;
    try {
      state = (await api("GET", messagePath(queue, id))).state;
    } catch (error) {
      if (error.status !== 404) throw error;
    }
    const typing = document.activeElement && document.activeElement.tagName === "INPUT";
    if (state !== shown && !typing) location.reload();
  }

  // -- buttons ---------------------------------------------------------------------------

  let refreshNow = async () => {};

  async function act(control, action) {
    const queue = body.dataset.queue;
    const path = queuePath(queue);
    control.disabled = true;
    try {
      await action(path);
      banner.hidden = true;
      if (page === "message") {
        location.reload();
      } else {
        await refreshNow();
      }
    } catch (error) {
      showError(error.message);
    } finally {
      control.disabled = false;
    }
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const id = button.dataset.id;
    switch (button.dataset.action) {
      case "cancel":
        if (!confirm(`Cancel message ${id}? It will not be delivered.`)) return;
        act(button, async (path) => {
          await api("DELETE", messagePath(body.dataset.queue, id));
          const row = button.closest("tr");
          if (row) row.remove();
        });
        break;
      case "retry":
        act(button, (path) => api("POST", `${path}/dead/retry`, { ids: [id] }));
        break;
      case "retry-all":
        if (!confirm("Retry every dead letter of this queue?")) return;
        act(button, (path) => api("POST", `${path}/dead/retry`, { ids: null }));
        break;
      default:
    }
  });

  document.addEventListener("submit", (event) => {
    const logout = event.target.closest("form[data-action='logout']");
    if (logout) {
      event.preventDefault();
      signOut(logout.action);
      return;
    }
    const form = event.target.closest("form[data-action='reschedule']");
    if (!form) return;
    event.preventDefault();
    const raw = form.elements.delay.value.trim();
    const delay = /^\d+(\.\d+)?$/.test(raw) ? Number(raw) : raw;
    const submit = form.querySelector("button[type='submit']");
    act(submit, () => api("POST", `${messagePath(body.dataset.queue, form.dataset.id)}/reschedule`, { delay }));
  });

  // -- start -----------------------------------------------------------------------------

  if (page === "signed_in") {
    startSignedIn();
    return;
  }
  if (page === "login") {
    startLogin();
    return;
  }
  setInterval(tickTimes, 1000);
  // A message the API cannot name is not refreshed: its page stays as rendered.
  const tasks = { overview: refreshOverview, queue: refreshQueue };
  if (page === "message" && reachableByApi(body.dataset.id)) tasks.message = refreshMessage;
  if (tasks[page]) refreshNow = autoRefresh(tasks[page]);
})();
