#!/bin/sh
# Mutual TLS between the ratekeeper replicas without cert-manager (docs/cluster.md, "Peer
# security"): makes a CA and the one certificate every replica shares, valid for the DNS
# name `ratekeeper-peers` (what --peer-tls-name checks) as server and client, and prints the
# Secret ratekeeper-peer-tls (tls.crt, tls.key, ca.crt) to apply:
#
#   sh deploy/kubernetes/peer-certs.sh OUT_DIR | kubectl apply -n NS -f -
#
# Keep OUT_DIR/ca.key safe (it signs peers) or delete it. Re-run to renew (same CA when
# OUT_DIR/ca.key exists); ratekeeper reloads the Secret when the kubelet updates it.
set -eu
out=${1:?usage: peer-certs.sh OUT_DIR}
name=${PEER_TLS_NAME:-ratekeeper-peers}
days=${PEER_TLS_DAYS:-90}
mkdir -p "$out"
cd "$out"
if [ ! -f ca.key ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=ratekeeper-peer-ca" -keyout ca.key -out ca.crt 2>/dev/null
fi
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -subj "/CN=$name" -keyout tls.key -out tls.csr 2>/dev/null
printf 'subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=digitalSignature,keyEncipherment\nbasicConstraints=CA:FALSE\n' "$name" > tls.ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" \
  -extfile tls.ext -out tls.crt 2>/dev/null
rm -f tls.csr tls.ext
b64() { base64 < "$1" | tr -d '\n'; }
cat <<YAML
apiVersion: v1
kind: Secret
metadata:
  name: ratekeeper-peer-tls
type: kubernetes.io/tls
data:
  tls.crt: $(b64 tls.crt)
  tls.key: $(b64 tls.key)
  ca.crt: $(b64 ca.crt)
YAML
