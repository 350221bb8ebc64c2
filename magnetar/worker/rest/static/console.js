// The Magnetar console: the cluster and its functions, from the worker's public REST API only.
// Every 2 s it polls what the page shows and draws the counters' rates as small SVG charts.

const POLL_MS = 2000;
const HISTORY = 60; // samples kept per function: two minutes at one every 2 s
const RATES = [
  ["received", "received/s"],
  ["processed", "processed/s"],
  ["exceptions", "exceptions/s"],
  ["deadLetters", "dead letters/s"],
  ["latency", "latency ms"],
];

const $ = (selector) => document.querySelector(selector);

/** An element with attributes (on* are listeners) and children (strings become text). */
function el(tag, attributes = {}, ...children) {
  const svg = ["svg", "path", "line"].includes(tag);
  const node = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag)
    : document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  node.append(...children.flat().filter((c) => c !== null && c !== undefined));
  return node;
}

// --- the REST API, with the user's token ---------------------------------------------------

/** A request the worker refused: its status and Pulsar's `reason`. */
class Refusal extends Error {
  constructor(status, reason) {
    super(reason);
    this.status = status;
  }
}

let token = sessionStorage.getItem("magnetar-token") || "";

async function api(method, path, body) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const response = await fetch(path, { method, headers, body });
  const text = await response.text();
  if (!response.ok) {
    let reason = text || response.statusText;
    try {
      reason = JSON.parse(text).reason ?? reason;
    } catch {
      // not JSON: the text itself is the reason
    }
    // the worker names its scheme when the token is missing or bad, not when a role may not
    if (response.status === 401 && response.headers.has("www-authenticate")) askForToken(reason);
    throw new Refusal(response.status, reason);
  }
  const json = (response.headers.get("content-type") || "").includes("application/json");
  return json && text ? JSON.parse(text) : text; // a 204 has no body
}

const get = (path) => api("GET", path);
const segments = (...parts) => parts.map(encodeURIComponent).join("/");
const functionPath = (fqfn) => `/admin/v3/functions/${segments(...fqfn.split("/"))}`;
const reasonOf = (error) => (error instanceof Refusal ? error.message : `${error}`);

function multipart(fields) {
  const body = new FormData();
  for (const [name, value] of Object.entries(fields)) body.append(name, value);
  return body;
}

function say(selector, text, ok) {
  const message = $(selector);
  message.textContent = text;
  message.className = `message ${ok ? "ok" : "error"}`;
}

function askForToken(reason) {
  $("#token-form").hidden = false;
  $("#notice").hidden = false;
  $("#notice").textContent = `This worker asks for a token: ${reason}`;
}

$("#token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  token = $("#token").value.trim();
  sessionStorage.setItem("magnetar-token", token);
  $("#token-form").hidden = true;
  $("#notice").hidden = true;
  $("#forget-token").hidden = !token;
  tick();
});

$("#forget-token").addEventListener("click", () => {
  token = "";
  sessionStorage.removeItem("magnetar-token");
  $("#forget-token").hidden = true;
  tick();
});
$("#forget-token").hidden = !token;

// --- counters over time ---------------------------------------------------------------------

const history = new Map(); // fqfn -> the last samples of its summed counters

function record(fqfn, status) {
  const statuses = status.instances.map((instance) => instance.status);
  const sum = (field) => statuses.reduce((total, s) => total + (s[field] || 0), 0);
  const samples = history.get(fqfn) ?? [];
  samples.push({
    at: Date.now(),
    received: sum("numReceived"),
    processed: sum("numSuccessfullyProcessed"),
    exceptions: sum("numUserExceptions") + sum("numSystemExceptions"),
    deadLetters: sum("numDeadLettered"),
    // averageLatency is each instance's mean since it started: weighted, it gives the interval's
    latencyTotal: statuses.reduce(
      (total, s) => total + (s.averageLatency || 0) * (s.numSuccessfullyProcessed || 0), 0),
  });
  if (samples.length > HISTORY + 1) samples.shift();
  history.set(fqfn, samples);
}

/** Per metric, one value for each interval between samples (null: nothing to say). */
function rates(fqfn) {
  const samples = history.get(fqfn) ?? [];
  const series = Object.fromEntries(RATES.map(([metric]) => [metric, []]));
  for (let i = 1; i < samples.length; i++) {
    const [before, after] = [samples[i - 1], samples[i]];
    const seconds = (after.at - before.at) / 1000;
    for (const metric of ["received", "processed", "exceptions", "deadLetters"]) {
      // a restarted instance counts from zero again: never a negative rate
      series[metric].push(Math.max(0, (after[metric] - before[metric]) / seconds));
    }
    const processed = after.processed - before.processed;
    series.latency.push(processed > 0 ? (after.latencyTotal - before.latencyTotal) / processed : null);
  }
  return series;
}

const format = (value) => (value === null || value === undefined ? "–"
  : value.toFixed(value >= 100 ? 0 : value >= 1 || value === 0 ? 1 : 2));

/** A time-series chart of `values` (oldest first; null leaves a gap), newest at the right. */
function chart(values, width, height) {
  const top = Math.max(0, ...values.filter((v) => v !== null)) || 1;
  const step = width / (HISTORY - 1);
  let line = "";
  let pen = "M";
  values.forEach((value, i) => {
    if (value === null) {
      pen = "M";
      return;
    }
    const x = width - (values.length - 1 - i) * step;
    const y = height - 1 - (value / top) * (height - 2);
    line += `${pen}${x.toFixed(1)},${y.toFixed(1)} `;
    pen = "L";
  });
  return el("svg", { class: "chart", width, height, viewBox: `0 0 ${width} ${height}` },
    el("line", { x1: 0, y1: height - 0.5, x2: width, y2: height - 0.5, class: "axis" }),
    el("path", { d: line || "M0,0", class: "series" }));
}

/** The newest value of a rate and its chart. */
function rateCell(values, metric, width, height) {
  const latest = values.length ? values[values.length - 1] : null;
  return el("span", { class: "rate", "data-rate": metric },
    el("span", { class: "value" }, format(latest)), chart(values, width, height));
}

// --- the overview: cluster and functions -----------------------------------------------------

async function refreshCluster() {
  try {
    const [workers, leader, assignments, stats] = await Promise.all([
      get("/admin/v2/worker/cluster"),
      get("/admin/v2/worker/cluster/leader"),
      get("/admin/v2/worker/assignments"),
      get("/admin/v2/worker-stats/metrics"),
    ]);
    const here = stats[0]?.dimensions.workerId;
    const metrics = stats[0]?.metrics ?? {};
    $("#served-by").textContent = here ? `served by ${here}` : "";
    $("#cluster-summary").textContent = `${workers.length} workers · leader ${leader.workerId}`
      + ` · term ${metrics["cluster.term"]} · assignment ${metrics["cluster.assignmentVersion"]}`;
    $("#workers tbody").replaceChildren(...workers.map((worker) => el("tr",
      { "data-worker": worker.workerId },
      el("td", {}, worker.workerId, worker.workerId === here ? " (this page)" : ""),
      el("td", {}, worker.workerId === leader.workerId ? "leader" : "member"),
      el("td", {}, el("a", { href: `${worker.adminUrl}/console/` }, worker.adminUrl)),
      el("td", { class: "placement" }, (assignments[worker.workerId] ?? []).map((key) => {
        const fqfn = key.slice(0, key.lastIndexOf(":"));
        return el("a", { class: "chip", href: `#/functions/${fqfn}`, "data-instance": key }, key);
      })))));
  } catch (error) {
    $("#cluster-summary").textContent = `Cannot show the cluster: ${reasonOf(error)}`;
  }
}

async function listFunctions() {
  let tenants;
  try {
    tenants = await get("/admin/v2/tenants");
  } catch (error) {
    // listing tenants takes a superuser: a tenant's admin sees the tenant of the deploy form
    if (error.status !== 401) throw error;
    tenants = [$("#deploy-form").elements.tenant.value];
  }
  const namespaces = (await Promise.all(
    tenants.map((tenant) => get(`/admin/v2/namespaces/${segments(tenant)}`)))).flat();
  const names = await Promise.all(
    namespaces.map((namespace) => get(`/admin/v3/functions/${segments(...namespace.split("/"))}`)));
  return namespaces.map((namespace, i) => [namespace, names[i]]).filter(([, n]) => n.length);
}

async function refreshFunctions() {
  let listed;
  try {
    listed = await listFunctions();
  } catch (error) {
    $("#functions").replaceChildren(el("p", { class: "error" },
      `Cannot list the functions: ${reasonOf(error)}`));
    return;
  }
  const statuses = await Promise.all(listed.flatMap(([namespace, names]) => names.map(
    (name) => get(`${functionPath(`${namespace}/${name}`)}/status`).catch((error) => error))));
  let next = 0;
  const sections = listed.map(([namespace, names]) => el("section", { class: "namespace" },
    el("h3", {}, namespace),
    el("table", { class: "functions" },
      el("thead", {}, el("tr", {}, el("th", {}, "Function"), el("th", {}, "Status"),
        RATES.map(([, label]) => el("th", {}, label)))),
      el("tbody", {}, names.map((name) => {
        const fqfn = `${namespace}/${name}`;
        const status = statuses[next++];
        if (status instanceof Error) {
          return el("tr", {}, el("td", {}, name), el("td", { colspan: 6 }, reasonOf(status)));
        }
        record(fqfn, status);
        const series = rates(fqfn);
        return el("tr", { "data-function": fqfn },
          el("td", {}, el("a", { href: `#/functions/${fqfn}` }, name)),
          el("td", { class: "status" }, `${status.numRunning}/${status.numInstances} running`),
          RATES.map(([metric]) => el("td", {}, rateCell(series[metric], metric, 90, 22))));
      })))));
  $("#functions").replaceChildren(...(sections.length ? sections
    : [el("p", { class: "muted" }, "No functions yet: deploy one below.")]));
}

$("#deploy-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const fields = Object.fromEntries(new FormData(event.target));
  const { tenant, namespace, name, code } = fields;
  let config;
  try {
    config = {
      ...(fields.extra.trim() ? JSON.parse(fields.extra) : {}),
      tenant, namespace, name,
      inputs: fields.inputs.split(",").map((t) => t.trim()).filter(Boolean),
      parallelism: Number(fields.parallelism || 1),
    };
  } catch (error) {
    say("#deploy-message", `The extra fields are not JSON: ${error.message}`, false);
    return;
  }
  if (fields.output.trim()) config.output = fields.output.trim();
  if (fields.className.trim()) config.className = fields.className.trim();
  config[code.name.endsWith(".js") ? "js" : "py"] = code.name;
  const fqfn = `${tenant}/${namespace}/${name}`;
  say("#deploy-message", `Deploying ${fqfn}…`, true);
  try {
    await api("POST", functionPath(fqfn),
      multipart({ functionConfig: JSON.stringify(config), data: code }));
    const message = $("#deploy-message");
    say("#deploy-message", `Deployed ${fqfn}: `, true);
    message.append(el("a", { href: `#/functions/${fqfn}` }, "open it"));
    refreshFunctions();
  } catch (error) {
    say("#deploy-message", `Refused: ${reasonOf(error)}`, false);
  }
});

// --- one function -----------------------------------------------------------------------------

let shown = null; // the fqfn of the function page
let logsMissing = false; // the worker answered 404 for the log: not asked again on this page

async function refreshFunction(fqfn) {
  const path = functionPath(fqfn);
  let config;
  let status;
  try {
    [config, status] = await Promise.all([get(path), get(`${path}/status`)]);
  } catch (error) {
    $("#function-summary").textContent = reasonOf(error);
    return;
  }
  if (fqfn !== shown) return; // the user moved on while we waited
  record(fqfn, status);
  const series = rates(fqfn);
  const totals = history.get(fqfn).at(-1);
  const output = config.output ? ` → ${config.output}` : "";
  $("#function-summary").replaceChildren(
    `${status.numRunning} of ${status.numInstances} instances running · `,
    `${(config.inputs ?? []).join(", ")}${output} · `,
    ...RATES.slice(0, 4).flatMap(([metric, label], i) => [i ? ", " : "",
      el("span", { "data-total": metric }, `${totals[metric]}`), ` ${label.replace("/s", "")}`]));
  $("#function-charts").replaceChildren(...RATES.map(([metric, label]) => el("figure", {},
    el("figcaption", {}, label), rateCell(series[metric], metric, 190, 48))));
  $("#instances tbody").replaceChildren(...status.instances.map(({ instanceId, status: s }) =>
    el("tr", { "data-instance-id": instanceId },
      el("td", {}, `${instanceId}`),
      el("td", {}, s.workerId || "–"),
      el("td", {}, s.running ? "running" : `not running${s.error ? `: ${s.error}` : ""}`),
      ...[s.numRestarts, s.numReceived, s.numSuccessfullyProcessed,
        (s.numUserExceptions || 0) + (s.numSystemExceptions || 0), s.numDeadLettered]
        .map((n) => el("td", { class: "number" }, `${n ?? 0}`)),
      el("td", { class: "number" }, format(s.averageLatency)),
      el("td", { class: "actions" }, ["stop", "start", "restart"].map((action) =>
        el("button", { onclick: () => act(action, instanceId) }, action))))));
  showExceptions(status.instances);
  if (!logsMissing) await showLog(fqfn, status.instances.length);
  $("#function-config").textContent = JSON.stringify(config, null, 2);
}

function showExceptions(instances) {
  const items = instances.flatMap(({ instanceId, status: s }) => [
    ...(s.latestUserExceptions ?? []).map((e) => ({ ...e, instanceId, kind: "user" })),
    ...(s.latestSystemExceptions ?? []).map((e) => ({ ...e, instanceId, kind: "system" })),
  ]).sort((a, b) => b.timestampMs - a.timestampMs);
  $("#exceptions").replaceChildren(...(items.length ? [el("ul", { class: "exceptions" },
    items.map((e) => el("li", {},
      el("span", { class: "muted" },
        `${new Date(e.timestampMs).toLocaleTimeString()} · instance ${e.instanceId}, ${e.kind}`),
      el("pre", {}, e.exceptionString))))]
    : [el("p", { class: "muted" }, "None.")]));
}

async function showLog(fqfn, instances) {
  const select = $("#log-instance");
  if (select.options.length !== instances) {
    select.replaceChildren(...Array.from({ length: instances }, (_, i) => el("option", {}, `${i}`)));
  }
  const pane = $("#log");
  const atBottom = pane.scrollTop + pane.clientHeight >= pane.scrollHeight - 4;
  try {
    const log = await get(`${functionPath(fqfn)}/${select.value || 0}/logs`);
    pane.textContent = typeof log === "string" ? log : JSON.stringify(log, null, 2);
    pane.classList.remove("muted");
  } catch (error) {
    pane.classList.add("muted");
    logsMissing = error.status === 404 || error.status === 405;
    pane.textContent = logsMissing
      ? `Logs are not available from this worker (it answered ${error.status}: ${error.message}).`
      : `Cannot read the log: ${reasonOf(error)}`;
  }
  if (atBottom) pane.scrollTop = pane.scrollHeight;
}

/** Stop, start or restart the function, or one instance of it. */
async function act(action, instanceId) {
  const target = instanceId === undefined ? "" : `/${instanceId}`;
  const what = instanceId === undefined ? shown : `instance ${instanceId} of ${shown}`;
  try {
    await api("POST", `${functionPath(shown)}${target}/${action}`);
    say("#function-message", `${action}: done for ${what}.`, true);
  } catch (error) {
    say("#function-message", `${action} refused: ${reasonOf(error)}`, false);
  }
  tick();
}

for (const button of document.querySelectorAll(".actions > [data-action]")) {
  button.addEventListener("click", () => act(button.dataset.action));
}

$("#log-instance").addEventListener("change", () => showLog(shown, $("#log-instance").options.length));

$("#trigger-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const out = $("#trigger-output");
  out.className = "output";
  out.textContent = "Waiting for the output…";
  try {
    const answer = await api("POST", `${functionPath(shown)}/trigger`,
      multipart({ data: event.target.elements.value.value }));
    out.textContent = answer === "" ? "(the function has no output topic)" : answer;
  } catch (error) {
    out.className = "output error";
    out.textContent = `Refused: ${reasonOf(error)}`;
  }
});

$("#state-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const out = $("#state-output");
  out.className = "output";
  try {
    const key = event.target.elements.key.value;
    const state = await get(`${functionPath(shown)}/state/${encodeURIComponent(key)}`);
    const [value, kind] = state.numberValue !== null ? [state.numberValue, "counter"]
      : state.stringValue !== null ? [state.stringValue, "text"] : [state.byteValue, "base64"];
    out.textContent = `${key} = ${value}\n(${kind}, version ${state.version})`;
  } catch (error) {
    out.className = "output error";
    out.textContent = reasonOf(error);
  }
});

// --- routing and polling ------------------------------------------------------------------------

function route() {
  const match = location.hash.match(/^#\/functions\/([^/]+)\/([^/]+)\/([^/]+)$/);
  shown = match ? match.slice(1).map(decodeURIComponent).join("/") : null;
  $("#overview").hidden = shown !== null;
  $("#function-page").hidden = shown === null;
  logsMissing = false;
  if (shown) {
    $("#function-title").textContent = shown;
    for (const id of ["#function-message", "#trigger-output", "#state-output"]) {
      $(id).textContent = "";
    }
    $("#trigger-form").reset();
    $("#state-form").reset();
  }
}

let polling = false;

async function tick() {
  if (polling) return;
  polling = true;
  try {
    await (shown ? refreshFunction(shown) : Promise.all([refreshCluster(), refreshFunctions()]));
  } finally {
    polling = false;
  }
}

window.addEventListener("hashchange", () => {
  route();
  tick();
});
route();
tick();
setInterval(tick, POLL_MS);
