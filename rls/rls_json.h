/*
 * rls_json.h: ShouldRateLimit's messages in proto3 JSON, as upstream's
 * /json endpoint reads and writes them (Go's protojson): a request's JSON
 * to a RateLimitRequest's bytes, a RateLimitResponse's bytes to JSON.
 * Field names are read in both spellings (hits_addend, hitsAddend) and
 * written in lowerCamelCase; enums are written by name; fields at their
 * zero value are left out; a Duration is a string ("35s", "1.500s").
 *
 * Threads: any; nothing is shared.
 */
#ifndef RL_RLS_JSON_H
#define RL_RLS_JSON_H

#include <stddef.h>
#include <stdint.h>

/* rls_json_request reads a RateLimitRequest from json (len bytes) and
 * packs it into *msg (malloc'd, *msg_len bytes): 0, or -1 with what is
 * wrong in err (a field's path and why). */
int rls_json_request(const char *json, size_t len, uint8_t **msg,
                     size_t *msg_len, char *err, size_t cap);

/* rls_json_response writes a RateLimitResponse's bytes as JSON: the text
 * (malloc'd, NUL-terminated), its overall code in *code (0 UNKNOWN, 1 OK,
 * 2 OVER_LIMIT); NULL when the bytes do not decode, a string is not
 * UTF-8 or memory runs out. */
char *rls_json_response(const uint8_t *msg, size_t len, int *code);

#endif
