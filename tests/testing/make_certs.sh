#!/usr/bin/env bash
# Makes the certificates the security tests use, with openssl, into DIR:
#   ca.pem ca.key              the test CA
#   server.pem server.key      the learner: CN=learner, SAN localhost, 127.0.0.1, ::1
#   client.pem client.key      a client the CA issued: CN=rollout-1
#   client2.pem client2.key    another: CN=generator-a
#   expired.pem expired.key    CN=rollout-1, issued by the CA, expired in 2020
#   rogue.pem rogue.key        CN=rollout-1, issued by another CA (rogue_ca.pem)
#   server2.pem server2.key    the learner again, issued by that other CA (a renewal
#                              under a new CA, for the reload test)
#   other.key                  a key that belongs to no certificate here
# EC P-256 keys: fast to make. Usage: make_certs.sh DIR
set -euo pipefail
dir=${1:?usage: make_certs.sh DIR}
mkdir -p "$dir"
cd "$dir"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
ca() {  # ca NAME SUBJECT
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -subj "$2" -days 3650 -out "$1.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}
leaf() {  # leaf NAME CN CA EXT [openssl ca dates...]
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  printf '%s\n' "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -days 825 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
ca ca "/CN=ASymPO-RL test CA"
ca rogue_ca "/CN=Some other CA"
leaf server learner ca "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1
extendedKeyUsage=serverAuth"
leaf client rollout-1 ca "extendedKeyUsage=clientAuth"
leaf client2 generator-a ca "extendedKeyUsage=clientAuth"
leaf rogue rollout-1 rogue_ca "extendedKeyUsage=clientAuth"
leaf server2 learner rogue_ca "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1
extendedKeyUsage=serverAuth"
# Expired: `openssl ca` is the only way OpenSSL 3.0 sets past dates.
key expired.key
openssl req -new -key expired.key -subj "/CN=rollout-1" -out expired.csr
mkdir -p ca.db && : > ca.db/index.txt && echo 01 > ca.db/serial
cat > ca.db/ca.cnf <<CNF
[ca]
default_ca = test
[test]
database = $PWD/ca.db/index.txt
serial = $PWD/ca.db/serial
new_certs_dir = $PWD/ca.db
default_md = sha256
policy = anything
x509_extensions = client
[anything]
commonName = supplied
[client]
extendedKeyUsage = clientAuth
CNF
openssl ca -batch -config ca.db/ca.cnf -cert ca.pem -keyfile ca.key -in expired.csr \
  -startdate 20200101000000Z -enddate 20200102000000Z -out expired.pem -notext 2>/dev/null
rm -rf expired.csr ca.db
key other.key
