// Conversions between the protos' well-known types and plain JavaScript values.
//
// google.protobuf.Struct/Value come from protobufjs's built-in copy of struct.proto, whose field
// names are camelCase (stringValue, structValue...) whatever keepCase says; the wire is the same.

/**
 * A plain JSON-like object as a google.protobuf.Struct, in the shape the loader takes.
 * @param {Record<string, unknown>} object
 * @returns {{fields: Record<string, object>}}
 */
export function toStruct(object) {
  return { fields: Object.fromEntries(Object.entries(object).map(([k, v]) => [k, toValue(v)])) };
}

/** @param {unknown} v @returns {object} */
function toValue(v) {
  if (v === null || v === undefined) return { nullValue: 'NULL_VALUE' };
  if (typeof v === 'number') return { numberValue: v };
  if (typeof v === 'string') return { stringValue: v };
  if (typeof v === 'boolean') return { boolValue: v };
  if (Array.isArray(v)) return { listValue: { values: v.map(toValue) } };
  if (typeof v === 'object') return { structValue: toStruct(/** @type {Record<string, unknown>} */ (v)) };
  throw new TypeError(`a ${typeof v} cannot go in a google.protobuf.Struct`);
}

/**
 * A google.protobuf.Struct as a plain object ({} for an absent one).
 * @param {{fields?: Record<string, any>} | null | undefined} struct
 * @returns {Record<string, unknown>}
 */
export function fromStruct(struct) {
  return Object.fromEntries(Object.entries(struct?.fields ?? {}).map(([k, v]) => [k, fromValue(v)]));
}

/** @param {any} v @returns {unknown} */
function fromValue(v) {
  switch (v?.kind) {
    case 'numberValue':
    case 'stringValue':
    case 'boolValue':
      return v[v.kind];
    case 'structValue':
      return fromStruct(v.structValue);
    case 'listValue':
      return (v.listValue?.values ?? []).map(fromValue);
    default:
      return null;
  }
}

/**
 * A google.protobuf.Timestamp ({seconds: '1700000000', nanos}) as a Date; null for an absent one.
 * @param {{seconds: string | number, nanos: number} | null | undefined} ts
 */
export function toDate(ts) {
  return ts ? new Date(Number(ts.seconds) * 1000 + Math.floor((ts.nanos ?? 0) / 1e6)) : null;
}

/**
 * An enum field of a request, as the loader sends it: a number as it is, or a name, whole
 * ('REWIND_SCOPE_TURN') or short ('turn', in any case). protobufjs would send a name it does not
 * know as the enum's 0, which for a scope means a rewind of everything since the point and for a
 * mode a files rewind: such a name is a TypeError instead, and nothing is sent.
 * @param {string} field the request field, for the error
 * @param {readonly string[]} names the enum's value names, as the .proto has them
 * @param {string} prefix what every name starts with ('REWIND_SCOPE_')
 * @param {unknown} value
 * @returns {string | number | undefined}
 */
export function enumValue(field, names, prefix, value) {
  if (value === undefined || value === null) return undefined;
  if (typeof value === 'number' && Number.isInteger(value)) return value;
  if (typeof value === 'string') {
    if (names.includes(value)) return value;
    const whole = prefix + value.trim().toUpperCase();
    if (names.includes(whole)) return whole;
  }
  const short = names.filter((n) => !n.endsWith('_UNSPECIFIED')).map((n) => `'${n.slice(prefix.length).toLowerCase()}'`);
  throw new TypeError(
    `${field}: ${JSON.stringify(value)} is not one of ${short.join(', ')} (or a whole ${prefix}... name, or its number)`,
  );
}
