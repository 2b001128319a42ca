// io::JsonFields and parse_json_object (io/json_fields.hpp), the checked JSON
// reading every file reader shares: each failure is a FileError naming the
// file, the field's path and the value it holds.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "snug/io/json_fields.hpp"

using Catch::Contains;
using snug::io::JsonFields;

namespace {

const nlohmann::json doc = nlohmann::json::parse(R"({
    "model": {"n_layer": 12, "name": "gpt2", "eps": 1e-5, "big": 1e300, "neg": -3, "frac": 2.5,
              "huge": 18446744073709551615, "shape": [2, 3]},
    "list": [1, 2]
})");

}  // namespace

TEST_CASE("JsonFields reads typed values and names the path of what is missing or wrong", "[json]") {
    const JsonFields F("state.snug", "header field");
    const nlohmann::json& m = F.object(doc, "model");
    CHECK(F.i32(m, "n_layer", "model.", 1) == 12);
    CHECK(F.string(m, "name", "model.") == "gpt2");
    CHECK(F.float32(m, "eps", "model.") == 1e-5f);
    CHECK(F.u64(m, "huge", "model.") == UINT64_MAX);
    CHECK(F.array(m, "shape", "model.").size() == 2);
    CHECK(F.as_u64(m["shape"][1], "model.shape[1]") == 3);

    CHECK_THROWS_WITH(F.i32(m, "layers", "model."),
                      Contains("state.snug: header field 'model.layers' is missing"));
    CHECK_THROWS_WITH(F.i32(m, "neg", "model.", 1),
                      Contains("header field 'model.neg' is -3, not an integer in [1, 2147483647]"));
    CHECK_THROWS_WITH(F.i32(m, "frac", "model."), Contains("'model.frac' is 2.5, not an integer"));
    CHECK_THROWS_WITH(F.u64(m, "neg", "model."), Contains("'model.neg' is -3, not an integer >= 0"));
    CHECK_THROWS_WITH(F.i64(m, "huge", "model.", 0, INT64_MAX),
                      Contains("'model.huge' is 18446744073709551615, not an integer in [0, 9223372036854775807]"));
    CHECK_THROWS_WITH(F.float32(m, "big", "model."),
                      Contains("'model.big' is 1e+300, not a number in the range of a 32-bit float"));
    CHECK_THROWS_WITH(F.string(m, "n_layer", "model."), Contains("'model.n_layer' is 12, not a string"));
    CHECK_THROWS_WITH(F.object(doc, "list"), Contains("'list' is [1,2], not an object"));
    CHECK_THROWS_WITH(F.array(m, "name", "model."), Contains("'model.name' is \"gpt2\", not an array"));
    CHECK_THROWS_AS(F.number(m, "name", "model."), snug::FileError);
}

TEST_CASE("parse_json_object names the file, and refuses a document that is not an object", "[json]") {
    const std::string bad = "{\"a\": ";
    CHECK_THROWS_WITH(snug::io::parse_json_object("config.json", bad.begin(), bad.end()),
                      Contains("config.json: malformed JSON: "));
    const std::string array = "[1, 2]";
    CHECK_THROWS_WITH(snug::io::parse_json_object("h.json", array.begin(), array.end(), "header"),
                      Contains("h.json: header is not a JSON object"));
    const std::string ok = "{\"a\": 1}";
    CHECK(snug::io::parse_json_object("x", ok.begin(), ok.end())["a"] == 1);
}

TEST_CASE("json_excerpt cuts a long value and says how long it was", "[json]") {
    const std::string e = snug::io::json_excerpt(nlohmann::json(std::string(200, 'x')), 10);
    CHECK(e == "\"xxxxxxxxx... (202 characters)");
}
