#!/bin/sh
# The injector's serving certificate without cert-manager (docs/injection.md, "Injecting the
# sidecar"): makes a CA and a certificate for the injector's Service
# (ratekeeper-injector.ratekeeper-system.svc), prints the Secret ratekeeper-injector-tls
# (tls.crt, tls.key, ca.crt) to apply, and writes OUT_DIR/ca-bundle-patch.json, the JSON
# patch that puts the CA into the MutatingWebhookConfiguration:
#
#   sh deploy/kubernetes/injector/webhook-certs.sh OUT_DIR | kubectl apply -f -
#   kubectl apply -k deploy/kubernetes/injector/
#   kubectl patch mutatingwebhookconfiguration ratekeeper-injector --type=json \
#     --patch-file OUT_DIR/ca-bundle-patch.json
#
# Keep OUT_DIR/ca.key safe (it signs webhook certificates) or delete it. Re-run to renew
# (same CA when OUT_DIR/ca.key exists, so the caBundle stays valid); the injector reloads
# the Secret when the kubelet updates it.
set -eu
out=${1:?usage: webhook-certs.sh OUT_DIR}
namespace=${INJECTOR_NAMESPACE:-ratekeeper-system}
service=${INJECTOR_SERVICE:-ratekeeper-injector}
days=${INJECTOR_TLS_DAYS:-365}
name="$service.$namespace.svc"
mkdir -p "$out"
cd "$out"
if [ ! -f ca.key ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=ratekeeper-injector-ca" -keyout ca.key -out ca.crt 2>/dev/null
fi
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -subj "/CN=$name" -keyout tls.key -out tls.csr 2>/dev/null
printf 'subjectAltName=DNS:%s,DNS:%s.cluster.local\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\nbasicConstraints=CA:FALSE\n' \
  "$name" "$name" > tls.ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" \
  -extfile tls.ext -out tls.crt 2>/dev/null
rm -f tls.csr tls.ext
b64() { base64 < "$1" | tr -d '\n'; }
bundle=$(b64 ca.crt)
printf '[{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "%s"}, {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": "%s"}]\n' \
  "$bundle" "$bundle" > ca-bundle-patch.json
cat <<YAML
apiVersion: v1
kind: Secret
metadata:
  name: ratekeeper-injector-tls
  namespace: $namespace
type: kubernetes.io/tls
data:
  tls.crt: $(b64 tls.crt)
  tls.key: $(b64 tls.key)
  ca.crt: $(b64 ca.crt)
YAML
