// JSON Schema -> Grammar (grammar.h): the compiler behind `response_format` `json_schema` and
// `json_object`, and the arguments of constrained tool calls.
//
// Supported (what OpenAI's strict mode and common clients such as pydantic send):
//   type: object, array, string, number, integer, boolean, null, or an array of them;
//   object: properties (emitted in declared order), required (others optional),
//     additionalProperties false or absent (only declared properties are emitted; with
//     additionalProperties true or a schema and declared properties, still only the declared
//     ones: every output validates, extra keys are never produced); an object without
//     properties is any object, or with an additionalProperties schema a map of that schema;
//   array: items (absent: any value; false: only []), minItems, maxItems;
//   string: minLength, maxLength (in code points; escapes \" \\ \/ \b \f \n \r \t \uXXXX with
//     surrogates paired; any UTF-8 character except controls below 0x20);
//   enum and const of any JSON values (with `type`, values of other types are dropped);
//   anyOf, oneOf (both as alternation: a oneOf output may match more than one branch when the
//     branches overlap), allOf with exactly one schema;
//   $ref to "#" or "#/..." JSON pointers ($defs, definitions, anywhere), recursion included;
//   annotations, always ignored: title, description, default, examples, $schema, $id,
//     $comment, deprecated, readOnly, writeOnly, $defs and definitions (read through $ref).
// Numbers: JSON syntax with at most 16 integer digits, 16 fraction digits and a two-digit
// exponent, so every output parses as a finite double (an integer fits int64).
//
// Refused with kInvalidArgument naming the keyword and its JSON pointer ("unsupported keyword
// 'pattern' at #/properties/zip"): pattern, patternProperties, format, minimum, maximum,
// exclusiveMinimum, exclusiveMaximum, multipleOf, minProperties, maxProperties, uniqueItems,
// prefixItems, contains, not, if/then/else, dependentSchemas, propertyNames, unevaluated*, and
// any keyword Folio does not know. With `strict = false`, the keywords that only narrow a value
// Folio already produces (format, minimum, maximum, exclusiveMinimum, exclusiveMaximum,
// multipleOf, minProperties, maxProperties, uniqueItems) and unknown keywords are ignored (the
// output may then violate them); the structural ones above are refused in both modes.
//
// Whitespace: at most `max_whitespace` bytes of [ \t\n\r] before the value and around every
// `{ } [ ] , :`; never inside numbers or literals. A bounded run keeps a model from emitting
// whitespace forever.
//
// Depth: with max_nesting_depth > 0, objects and arrays nest at most that deep (a branch that
// would go deeper is dropped: `anyOf [tree, null]` becomes `null` there); this also bounds
// recursive $ref schemas and json_object. 0: unlimited.
#pragma once

#include <cstdint>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "folio/base/result.h"
#include "folio/server/grammar.h"

namespace folio::server {

struct SchemaOptions {
  bool strict = true;
  // 20: a newline and four-space indentation five levels deep.
  int32_t max_whitespace = 20;
  int32_t max_nesting_depth = 0;
};

// kInvalidArgument: text that is not JSON, a refused keyword, a $ref that does not resolve,
// a schema that admits no value, or a length/item bound above 4096 (refused, not ignored).
Result<Grammar> compile_json_schema(std::string_view schema_json,
                                    const SchemaOptions& options = {});
// An already parsed schema; ordered_json so that properties keep their declared order.
Result<Grammar> compile_parsed_json_schema(const nlohmann::ordered_json& schema,
                                           const SchemaOptions& options = {});

// Any JSON object (`response_format: {"type": "json_object"}`), same whitespace and depth rules.
Grammar json_object_grammar(const SchemaOptions& options = {});

}  // namespace folio::server
