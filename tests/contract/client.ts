// A TypeScript client of `delayq serve`, typed by openapi-typescript from the server's
// /openapi.json and compiled with `tsc --strict`: if the document stops describing the
// API as a client needs it (a field renamed, a lease that may be null), this stops
// compiling. Run against a live server, it checks every answer against the document:
// the status must be listed for the operation, its required headers sent, and a JSON
// body valid under the listed schema (ajv, strict mode).
//
//   node build/client.js BASE_URL [TOKEN]
//
// The same program runs against a server with a token (TOKEN given) and one without:
// the document is the same for both, and so is every answer but the 401 of a request
// without the token. Prints one line per failure and a summary; exits 1 if anything
// failed.
import createClient, { type Middleware } from "openapi-fetch";
import { Ajv2020 } from "ajv/dist/2020.js";
import type { ValidateFunction } from "ajv";
import type { components, paths } from "./generated/delayq.js";

type Schema = Record<string, unknown>;
type Operation = { responses: Record<string, { headers?: Record<string, { required?: boolean }>; content?: Record<string, { schema: Schema }> }> };
type Document = { paths: Record<string, Record<string, Operation>>; components: { schemas: Record<string, Schema> } };

const [base, token = ""] = process.argv.slice(2);
if (!base) {
  console.error("usage: node build/client.js BASE_URL [TOKEN]");
  process.exit(2);
}

const failures: string[] = [];
let checked = 0;
let bodies = 0;

function expect(condition: boolean, what: string): void {
  if (!condition) failures.push(what);
}

// -- the document, as ajv validators --------------------------------------------------
const documentAnswer = await fetch(new URL("/openapi.json", base)); // served without a token
const document = (await documentAnswer.json()) as Document;
const COMPONENTS = "https://delayq.invalid/components.json";
// The component schemas as one JSON Schema 2020-12 document, refs pointing into it.
const moved = JSON.parse(
  JSON.stringify(document).replaceAll('"#/components/schemas/', `"${COMPONENTS}#/$defs/`),
) as Document;
const ajv = new Ajv2020({ strict: true, allErrors: true });
ajv.addSchema({ $id: COMPONENTS, $defs: moved.components.schemas });
const validators = new Map<Schema, ValidateFunction>();

function validatorOf(schema: Schema): ValidateFunction {
  let validate = validators.get(schema);
  if (validate === undefined) {
    validate = ajv.compile(schema);
    validators.set(schema, validate);
  }
  return validate;
}

// Every answer goes through here: listed status, required headers, body schema.
const conformance: Middleware = {
  async onResponse({ request, response, schemaPath }) {
    checked += 1;
    const where = `${request.method} ${schemaPath} -> ${response.status}`;
    const operation = moved.paths[schemaPath]?.[request.method.toLowerCase()];
    const listed = operation?.responses[String(response.status)];
    if (listed === undefined) {
      failures.push(`${where}: this status is not in the document`);
      return undefined;
    }
    for (const [name, header] of Object.entries(listed.headers ?? {})) {
      expect(!header.required || response.headers.has(name), `${where}: no ${name} header`);
    }
    const type = (response.headers.get("content-type") ?? "").split(";")[0].trim();
    const content = listed.content?.[type];
    if (listed.content === undefined) {
      expect(response.headers.get("content-length") === "0" || response.status === 204, `${where}: a body the document does not list`);
    } else if (content === undefined) {
      failures.push(`${where}: content type ${type} is not in the document`);
    } else if (type === "application/json") {
      const validate = validatorOf(content.schema);
      const body: unknown = await response.clone().json();
      bodies += 1;
      if (!validate(body)) {
        failures.push(`${where}: ${ajv.errorsText(validate.errors)} in ${JSON.stringify(body)}`);
      }
    }
    return undefined;
  },
};

const authorization: Record<string, string> = token ? { Authorization: `Bearer ${token}` } : {};
const client = createClient<paths>({ baseUrl: base, headers: authorization });
client.use(conformance);
const queue = { queue: `contract-${Date.now()}` };

// -- put, get, reschedule, cancel ------------------------------------------------------
const put = await client.POST("/v1/queues/{queue}/messages", {
  params: { path: queue },
  body: { payload: { order: 42, note: "café" }, delay: "1h", id: "order-42" },
});
expect(put.response.status === 201 && put.data?.id === "order-42", "putMessage: the id given");
expect(put.data?.created === true, "putMessage: created");
const again = await client.POST("/v1/queues/{queue}/messages", {
  params: { path: queue },
  body: { payload: "ignored", id: "order-42" },
});
const kept: boolean | undefined = again.data?.created;
expect(again.response.status === 200 && kept === false, "putMessage: an existing id is kept (200)");

const got = await client.GET("/v1/queues/{queue}/messages/{id}", {
  params: { path: { ...queue, id: "order-42" } },
});
const scheduled: components["schemas"]["MessageOut"] | undefined = got.data;
expect(scheduled?.state === "scheduled", "getMessage: scheduled");
expect((scheduled?.due_at ?? 0) > Date.now(), "getMessage: due_at in the future (epoch ms)");

const moved_ = await client.POST("/v1/queues/{queue}/messages/{id}/reschedule", {
  params: { path: { ...queue, id: "order-42" } },
  body: { delay: 0 },
});
expect(moved_.data?.state === "ready", "rescheduleMessage: ready now");

await client.POST("/v1/queues/{queue}/messages", {
  params: { path: queue },
  body: { payload: "to cancel", delay: 3600, id: "gone" },
});
const cancelled = await client.DELETE("/v1/queues/{queue}/messages/{id}", {
  params: { path: { ...queue, id: "gone" } },
});
expect(cancelled.data?.cancelled === true, "cancelMessage: cancelled");
const missing = await client.GET("/v1/queues/{queue}/messages/{id}", {
  params: { path: { ...queue, id: "gone" } },
});
const notFound: string | undefined = missing.error?.error.code;
expect(missing.response.status === 404 && notFound === "not_found", "getMessage: 404 once cancelled");

// -- units: a due_at (epoch ms) goes back as at_ms; an `at` in milliseconds is refused ----
const units = { queue: `${queue.queue}-units` };
const inAMinute = Date.now() + 60_000;
const byMs = await client.POST("/v1/queues/{queue}/messages", {
  params: { path: units },
  body: { payload: 1, at_ms: inAMinute },
});
const byMsId = byMs.data?.id ?? "";
const readBack = await client.GET("/v1/queues/{queue}/messages/{id}", {
  params: { path: { ...units, id: byMsId } },
});
expect(readBack.data?.due_at === inAMinute, "putMessage at_ms: due_at is that millisecond");
const wrongUnit = await client.POST("/v1/queues/{queue}/messages", {
  params: { path: units },
  body: { payload: 1, at: inAMinute },
});
expect(
  wrongUnit.response.status === 422 && (wrongUnit.error?.error.message ?? "").includes("at_ms"),
  "putMessage at in ms: 422 naming at_ms",
);
await client.POST("/v1/queues/{queue}/purge", { params: { path: units }, body: {} });

// -- batch, reserve, ack, nack, extend ---------------------------------------------------
const batch = await client.POST("/v1/queues/{queue}/messages/batch", {
  params: { path: queue },
  body: { messages: [{ payload: 1 }, { payload: 2 }, { payload: 3 }] },
});
expect(batch.response.status === 201 && batch.data?.ids.length === 3, "putMessages: three ids");
expect(batch.data?.created.every((created) => created) === true, "putMessages: all created");

const reserved = await client.POST("/v1/queues/{queue}/reserve", {
  params: { path: queue },
  body: { max: 10, wait: 1 },
});
const held = reserved.data?.messages ?? [];
expect(held.length === 4, `reserveMessages: 4 messages, got ${held.length}`);
// A reserved message's lease is a string, never null: this line compiles only so.
const tokens: string[] = held.map((message) => message.lease);
expect(tokens.every((lease) => lease.length > 0), "reserveMessages: a lease token each");

const [first, second, third, fourth] = held;
if (first && second && third && fourth) {
  const path = (message: { id: string }) => ({ path: { ...queue, id: message.id } });
  const acked = await client.POST("/v1/queues/{queue}/messages/{id}/ack", {
    params: path(first),
    body: { lease: first.lease },
  });
  expect(acked.data?.acked === true, "ackMessage: acked");
  const again = await client.POST("/v1/queues/{queue}/messages/{id}/ack", {
    params: path(first),
    body: { lease: first.lease },
  });
  // Acked, the queue no longer holds the id: 404, as for every operation on an unknown id.
  expect(again.response.status === 404 && again.error?.error.code === "not_found", "ackMessage twice: 404 not_found");

  const dead = await client.POST("/v1/queues/{queue}/messages/{id}/nack", {
    params: path(second),
    body: { lease: second.lease, dead: true, error: "refused by the contract test" },
  });
  expect(dead.data?.state === "dead", "nackMessage dead: dead");
  const retried = await client.POST("/v1/queues/{queue}/messages/{id}/nack", {
    params: path(third),
    body: { lease: third.lease, delay: 60 },
  });
  expect(retried.data?.state === "scheduled", "nackMessage with a delay: scheduled");

  const extended = await client.POST("/v1/queues/{queue}/messages/{id}/extend", {
    params: path(fourth),
    body: { lease: fourth.lease, lease_seconds: 120 },
  });
  const expiry: number = extended.data?.lease_expires_at ?? 0;
  expect(expiry > Date.now() + 60_000, "extendLease: the new expiry (epoch ms)");
}

// -- dead letters, stats -----------------------------------------------------------------
const deadLetters = await client.GET("/v1/queues/{queue}/dead", {
  params: { path: queue, query: { limit: 10 } },
});
const lastError: string | null | undefined = deadLetters.data?.messages[0]?.last_error;
expect(lastError === "refused by the contract test", "deadMessages: the nacked one, with its error");
expect(deadLetters.data?.next_cursor === null, "deadMessages: one page, next_cursor null");

// -- a list a page at a time: follow next_cursor until it is null ------------------------
const paged: string[] = [];
let cursor: string | undefined;
for (let page = 0; page < 10; page++) {
  const { data } = await client.GET("/v1/queues/{queue}/messages", {
    params: { path: queue, query: { state: "active", limit: 1, ...(cursor ? { cursor } : {}) } },
  });
  paged.push(...(data?.messages ?? []).map((message) => message.id));
  if (!data?.next_cursor) break;
  cursor = data.next_cursor;
}
expect(paged.length === 1 && new Set(paged).size === paged.length, `peekMessages paged: ${JSON.stringify(paged)}`);
const unknownParameter = await client.GET("/v1/queues/{queue}/dead", {
  params: { path: queue, query: { limit: 10, ...({ limt: 5 } as object) } },
});
expect(unknownParameter.response.status === 422, "deadMessages with an unknown parameter: 422");

const stats = await client.GET("/v1/queues/{queue}/stats", { params: { path: queue } });
const counts = stats.data;
expect(
  counts !== undefined && counts.scheduled === 1 && counts.ready === 0 && counts.active === 1 && counts.dead === 1,
  `queueStats: 1 scheduled, 1 active, 1 dead, got ${JSON.stringify(counts)}`,
);

// -- bodies of defaults: {} is sent as JSON, and required --------------------------------
const retriedAll = await client.POST("/v1/queues/{queue}/dead/retry", { params: { path: queue }, body: {} });
expect(retriedAll.data?.retried === 1, `retryDead {}: the one dead message, got ${JSON.stringify(retriedAll.data)}`);
const defaults = await client.POST("/v1/queues/{queue}/reserve", { params: { path: queue }, body: {} });
expect(defaults.data?.messages.length === 1, "reserveMessages {}: the retried message");
// These do not compile: a body left out would go without Content-Type, which the server
// refuses (415) with a token or without. Never called.
export function bodiesAreRequired(): unknown[] {
  return [
    // @ts-expect-error reserveMessages needs a body ({} for the defaults)
    client.POST("/v1/queues/{queue}/reserve", { params: { path: queue } }),
    // @ts-expect-error retryDead needs a body
    client.POST("/v1/queues/{queue}/dead/retry", { params: { path: queue } }),
    // @ts-expect-error purgeQueue needs a body
    client.POST("/v1/queues/{queue}/purge", { params: { path: queue } }),
    // @ts-expect-error OPTIONS is answered but not in the document (no generated functions)
    client.OPTIONS("/v1/queues/{queue}/messages", { params: { path: queue } }),
  ];
}
// Nor do these: the document says what a body needs and what a field takes, as the
// server does (each is a 422). Never called.
export function typesAgreeWithTheServer(): unknown[] {
  const path = { path: { ...queue, id: "order-42" } };
  return [
    // @ts-expect-error a put needs payload or payload_base64 (else 422 missing_payload)
    client.POST("/v1/queues/{queue}/messages", { params: { path: queue }, body: {} }),
    // @ts-expect-error a reschedule needs delay, at or at_ms
    client.POST("/v1/queues/{queue}/messages/{id}/reschedule", { params: path, body: {} }),
    // @ts-expect-error null is not a time (omit delay instead)
    client.POST("/v1/queues/{queue}/messages", { params: { path: queue }, body: { payload: 1, delay: null } }),
    // @ts-expect-error nor for at_ms
    client.POST("/v1/queues/{queue}/messages/{id}/reschedule", { params: path, body: { at_ms: null } }),
    client.POST("/v1/queues/{queue}/messages", {
      params: { path: queue },
      // @ts-expect-error a callback's method is one of five
      body: { payload: null, callback: { url: "http://example.com/", method: "FETCH" } },
    }),
  ];
}
// Every field of an answer is there: null, never undefined, where there is nothing.
const fields = { queue: `${queue.queue}-fields` };
await client.POST("/v1/queues/{queue}/messages", {
  params: { path: fields },
  body: { payload: "all fields", delay: 3600, id: "fields" },
});
const checkedOut = await client.GET("/v1/queues/{queue}/messages/{id}", {
  params: { path: { ...fields, id: "fields" } },
});
expect(checkedOut.data !== undefined, "getMessage: the message put");
if (checkedOut.data) {
  const message: components["schemas"]["MessageOut"] = checkedOut.data;
  const lease: string | null = message.lease;
  const leaseEnds: number | null = message.lease_expires_at;
  const failed: string | null = message.last_error;
  const iso: string = message.due_at_iso;
  const where: components["schemas"]["CallbackSpec"] | null = message.callback;
  const bytes: string | null = message.payload_base64;
  expect(lease === null && leaseEnds === null && failed === null && where === null && bytes === null, "getMessage: null fields are null");
  expect(new Date(iso).getTime() === message.due_at, "getMessage: due_at_iso is due_at (epoch ms)");
}
const statsNow = await client.GET("/v1/queues/{queue}/stats", { params: { path: fields } });
if (statsNow.data) {
  const nextDue: number | null = statsNow.data.next_due_at;
  const lagSeconds: number = statsNow.data.lag;
  expect(nextDue === checkedOut.data?.due_at, "queueStats: next_due_at is the due_at (epoch ms)");
  expect(lagSeconds >= 0, "queueStats: lag in seconds");
}
const page = await client.GET("/v1/queues/{queue}/messages", { params: { path: fields, query: { limit: 1 } } });
const nextCursor: string | null = page.data ? page.data.next_cursor : null;
expect(page.data?.messages.length === 1 && page.data.messages[0]?.lease === null, `peekMessages: lease null, cursor ${nextCursor}`);
await client.POST("/v1/queues/{queue}/purge", { params: { path: fields }, body: {} });
// The same request without a body or Content-Type gets the same 415, token or not.
const url = (path: string) => new URL(path, base);
const bare = await fetch(url(`/v1/queues/${queue.queue}/purge`), { method: "POST", headers: authorization });
const bareError = (await bare.json()) as components["schemas"]["ErrorResponse"];
expect(bare.status === 415 && bareError.error.code === "unsupported_media_type", `purge without a body: 415, got ${bare.status}`);
// NaN is not JSON (JSON.stringify cannot even send it): the error of a body that is not.
const notJson = await fetch(url(`/v1/queues/${queue.queue}/messages`), {
  method: "POST",
  headers: { ...authorization, "Content-Type": "application/json" },
  body: '{"payload": NaN}',
});
const notJsonError = (await notJson.json()) as components["schemas"]["ErrorResponse"];
expect(
  notJson.status === 400 && notJsonError.error.code === "malformed_json" &&
    "400" in (moved.paths["/v1/queues/{queue}/messages"]?.post?.responses ?? {}),
  `put {"payload": NaN}: a listed 400 malformed_json, got ${notJson.status} ${JSON.stringify(notJsonError)}`,
);

// -- what a client without the token, or asking for the methods, gets ----------------
const anonymous = createClient<paths>({ baseUrl: base });
anonymous.use(conformance);
const asked = await anonymous.GET("/v1/queues/{queue}/stats", { params: { path: queue } });
if (token) {
  expect(asked.response.status === 401 && asked.error?.error.code === "unauthorized", "no token: 401");
} else {
  expect(asked.response.status === 200, "no token on a server without one: 200");
}
const health = await anonymous.GET("/healthz");
expect(health.data?.status === "ok", "getHealth: ok without the token");
const methods = await fetch(url(`/v1/queues/${queue.queue}/messages`), { method: "OPTIONS", headers: authorization });
expect(methods.status === 204 && methods.headers.get("allow")?.includes("POST") === true, "OPTIONS: 204, Allow names POST");
expect(
  Object.values(document.paths).every((operations) => !("options" in operations)),
  "the document lists no OPTIONS operation",
);

for (const failure of failures) console.error(`FAIL ${failure}`);
console.log(`contract: ${checked} answers checked (${bodies} bodies), ${failures.length} failures`);
process.exitCode = failures.length === 0 && bodies > 0 ? 0 : 1;
