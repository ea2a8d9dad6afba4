#!/bin/bash
# Configures nginx's module build for ngx_http_rl_module the way Debian
# builds its own nginx modules (dh_nginx): nginx-dev's sources with the
# packaged nginx's configure flags (conf_flags: --with-compat and the same
# modules), so that the module loads into /usr/sbin/nginx. The sources are
# copied first: nginx's configure writes a Makefile next to them, and
# /usr/share/nginx/src is the package's, not ours.
#
#   nginx-configure.sh NGINX_SRC DIR MODULE_DIR RL_INCLUDE RL_LIBS [CC_OPT]
#
# DIR/src gets the copy, DIR/objs the build; the module is then built with
# make -f DIR/objs/Makefile -C DIR/src modules.
set -euo pipefail
nginx_src=$1 dir=$2 module_dir=$3
export RL_INCLUDE=$4 RL_LIBS=$5
extra=${6:-}

if [ ! -f "$nginx_src/conf_flags" ]; then
    echo "rl: $nginx_src/conf_flags is missing: install nginx-dev" \
         "(make deps does, as root)" >&2
    exit 1
fi
rm -rf "$dir/src" "$dir/objs"
mkdir -p "$dir"
cp -a "$nginx_src" "$dir/src"
cd "$dir/src"
# shellcheck disable=SC1091  # conf_flags is nginx-dev's, read at run time
. ./conf_flags
# Debian's own build flags (hardening included), as dh_nginx passes them.
cflags="$(dpkg-buildflags --get CFLAGS) $(dpkg-buildflags --get CPPFLAGS)"
ldflags="$(dpkg-buildflags --get LDFLAGS)"
./configure --with-cc-opt="$cflags -fPIC $extra" \
    --with-ld-opt="$ldflags -fPIC" \
    "${NGX_CONF_FLAGS[@]}" \
    --add-dynamic-module="$module_dir" \
    --builddir="$dir/objs" > "$dir/configure.log" 2>&1 || {
    tail -n 30 "$dir/configure.log" >&2
    echo "rl: nginx's configure failed; see $dir/configure.log" >&2
    exit 1
}
