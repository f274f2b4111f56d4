#!/bin/sh
# make-pki.sh DIR ID=HOST [ID=HOST ...]: a private CA and the certificates of a mesh's routers, with
# openssl (docs/operations.md, "Across machines"; docs/security.md for what each name is for).
#
#   DIR/ca.pem, ca.key            the CA: routers trust it for each other (mesh_tls_ca) and clients
#                                 trust it for the routers (--ca); keep ca.key off the routers' hosts
#   DIR/ID.pem, ID.key            router ID's mesh certificate: CN=ID, SAN DNS:ID and URI
#                                 urn:oncemesh:router:ID (mesh_tls_cert, mesh_tls_key)
#   DIR/ID-client.pem, .key       router ID's client listener (tls_cert, tls_key): SAN DNS:HOST,
#                                 the name clients connect to (amqps://HOST:PORT)
#
# Existing files are kept (run it again to add a router). Keys are EC P-256, mode 0600.
set -eu
if [ $# -lt 2 ]; then
    echo "usage: $0 DIR ID=HOST [ID=HOST ...]   e.g. $0 pki r1=r1.example.net r2=r2.example.net" >&2
    exit 2
fi
dir=$1
shift
mkdir -p "$dir"
cd "$dir"
umask 077
days=825
newkey="-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes"
if [ ! -f ca.pem ]; then
    # shellcheck disable=SC2086
    openssl req -x509 $newkey -keyout ca.key -out ca.pem -days 3650 -subj "/CN=oncemesh mesh CA" \
        -addext "basicConstraints=critical,CA:TRUE,pathlen:0" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        2>/dev/null
fi
issue() {  # issue STEM SUBJECT_CN SUBJECT_ALT_NAMES
    [ -f "$1.pem" ] && return 0
    printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=%s\n' "$3" > "$1.ext"
    # shellcheck disable=SC2086
    openssl req -new $newkey -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
    openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" -sha256 \
        -extfile "$1.ext" -out "$1.pem" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}
for spec in "$@"; do
    id=${spec%%=*}
    host=${spec#*=}
    if [ -z "$id" ] || [ "$id" = "$spec" ] || [ -z "$host" ]; then
        echo "make-pki.sh: give routers as ID=HOST, got '$spec'" >&2
        exit 2
    fi
    issue "$id" "$id" "DNS:$id,URI:urn:oncemesh:router:$id"
    issue "$id-client" "$host" "DNS:$host"
    echo "$dir/$id.pem $dir/$id-client.pem"
done
chmod 0644 ./*.pem
