// Inputs for a kind's `args`, generated from the JSON Schema the services announce (pydantic's
// output for built-ins and plug-ins alike). Simple properties get a typed input; objects,
// arrays, references and unions get a JSON textarea, so every schema stays usable.
//
// An input left empty is left out of `args`: the kind's own default applies, exactly as with
// the API. The server validates everything again and its 422 says which field is wrong.

const SIMPLE = new Set(["string", "number", "integer", "boolean"]);

/**
 * The property as one simple type, or null when it needs the JSON textarea.
 * `str | None` (anyOf [{type: string}, {type: null}]) counts as a string: empty means null/default.
 */
function simpleType(prop) {
  if (SIMPLE.has(prop.type)) return prop;
  if (Array.isArray(prop.anyOf)) {
    const notNull = prop.anyOf.filter((variant) => variant.type !== "null");
    if (notNull.length === 1 && SIMPLE.has(notNull[0].type)) return { ...notNull[0], ...withoutAnyOf(prop) };
  }
  return null;
}

function withoutAnyOf(prop) {
  const { anyOf: _ignored, ...rest } = prop;
  return rest;
}

function element(tag, attrs = {}, text = "") {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null && value !== false) el.setAttribute(key, value === true ? "" : value);
  }
  if (text) el.textContent = text;
  return el;
}

function inputFor(name, simple, id) {
  const testid = `arg-${name}`;
  if (Array.isArray(simple.enum)) {
    const select = element("select", { id, "data-testid": testid });
    select.append(element("option", { value: "" }, "(default)"));
    for (const value of simple.enum) select.append(element("option", { value: String(value) }, String(value)));
    return select;
  }
  if (simple.type === "boolean") {
    // A select, not a checkbox: "not given" (the kind's default) must stay expressible.
    const select = element("select", { id, "data-testid": testid });
    const fallback = simple.default === undefined ? "" : ` (${simple.default})`;
    select.append(element("option", { value: "" }, `default${fallback}`));
    select.append(element("option", { value: "true" }, "true"), element("option", { value: "false" }, "false"));
    return select;
  }
  if (simple.type === "number" || simple.type === "integer") {
    return element("input", {
      id,
      type: "number",
      step: simple.type === "integer" ? "1" : "any",
      min: simple.minimum,
      max: simple.maximum,
      placeholder: simple.default ?? "",
      "data-testid": testid,
    });
  }
  return element("input", {
    id,
    type: "text",
    maxlength: simple.maxLength,
    placeholder: simple.default ?? simple.format ?? "",
    autocomplete: "off",
    "data-testid": testid,
  });
}

function jsonInput(id, testid, prop) {
  const placeholder = prop.default === undefined ? "JSON" : JSON.stringify(prop.default);
  return element("textarea", { id, rows: 2, placeholder, spellcheck: "false", "data-testid": testid });
}

/** The value typed in one field, or undefined for "not given". Throws a readable Error. */
function readField(field) {
  const raw = field.input.value.trim();
  if (raw === "") return undefined;
  const label = field.name ? `args.${field.name}` : "args";
  if (field.json) {
    try {
      return JSON.parse(raw);
    } catch (err) {
      throw new Error(`${label}: not valid JSON (${err.message})`);
    }
  }
  const type = field.simple.type;
  if (Array.isArray(field.simple.enum) && type !== "string") return JSON.parse(raw);
  if (type === "boolean") return raw === "true";
  if (type === "number" || type === "integer") {
    const number = Number(raw);
    if (!Number.isFinite(number) || (type === "integer" && !Number.isInteger(number))) {
      throw new Error(`${label}: ${raw} is not ${type === "integer" ? "an integer" : "a number"}`);
    }
    return number;
  }
  return field.input.value; // strings as typed (spaces may matter)
}

function describe(prop) {
  const parts = [];
  if (prop.description) parts.push(prop.description);
  if (prop.default !== undefined && prop.default !== null) parts.push(`default ${JSON.stringify(prop.default)}`);
  return parts.join(" · ");
}

function fieldBox(name, prop, required, input) {
  const box = element("div", { class: "arg" });
  const label = element("label", { for: input.id });
  label.append(element("span", {}, prop.title || name), " ", element("code", {}, name));
  if (required) label.append(element("span", { class: "required", title: "required" }, " *"));
  const help = describe(prop);
  box.append(label, input);
  if (help) {
    const helpId = `${input.id}-help`;
    input.setAttribute("aria-describedby", helpId);
    box.append(element("small", { id: helpId }, help));
  }
  if (required) input.required = true;
  return box;
}

/**
 * Replace the fieldset's inputs with ones for `schema`; returns read(), which gives the args
 * object to send (throws an Error naming the field when a value cannot be sent).
 */
export function renderArgs(fieldset, schema) {
  const legend = fieldset.querySelector("legend");
  fieldset.replaceChildren(legend);
  const props = schema && typeof schema.properties === "object" ? schema.properties : {};
  const required = new Set(Array.isArray(schema?.required) ? schema.required : []);
  const fields = [];
  for (const [name, prop] of Object.entries(props)) {
    const id = `arg-input-${name}`;
    const simple = simpleType(prop);
    const input = simple ? inputFor(name, simple, id) : jsonInput(id, `arg-${name}`, prop);
    fieldset.append(fieldBox(name, prop, required.has(name), input));
    fields.push({ name, simple, json: !simple, input });
  }
  if (fields.length === 0) {
    if (schema?.additionalProperties === false) {
      fieldset.append(element("p", { class: "help" }, "This kind takes no arguments."));
    } else {
      // No properties to go by: the whole args object as JSON.
      const input = jsonInput("arg-input-all", "arg-json", { default: {} });
      fieldset.append(fieldBox("args", { title: "Arguments (JSON object)" }, false, input));
      fields.push({ name: "", simple: null, json: true, input, whole: true });
    }
  }
  return () => readArgs(fields);
}

function readArgs(fields) {
  const args = {};
  for (const field of fields) {
    const value = readField(field);
    if (value === undefined) continue;
    if (field.whole) {
      if (typeof value !== "object" || value === null || Array.isArray(value)) {
        throw new Error("args: must be a JSON object");
      }
      Object.assign(args, value);
    } else {
      args[field.name] = value;
    }
  }
  return args;
}
