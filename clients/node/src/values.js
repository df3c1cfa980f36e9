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
