/*
 * rlctl_json.h: a JSON string on stdout, escaped. Private to rlctl.
 */
#ifndef RL_RLCTL_JSON_H
#define RL_RLCTL_JSON_H

void rlctl_json_string(const char *s);

#endif
