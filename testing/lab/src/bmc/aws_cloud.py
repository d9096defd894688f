"""A lab cloud speaking the EC2 API: moto's AWS emulator, as a proxy, with one running instance
per lab node (tagged Name=<node>) and one for the host the fencing runs from (fence_aws reads
its own instance from the instance metadata, and fences only while that instance runs). Stopping
or starting a node's instance is reported to the lab, and acknowledged, before moto answers: a
stop kills the node first, as the lab's BMCs do (sushy_bmc.py).

Clients reach it as their proxy (HTTPS_PROXY, and HTTP_PROXY for the instance metadata) and trust
moto's CA (AWS_CA_BUNDLE): Debian's botocore has no endpoint override.

Run with the moto virtualenv's python (the lab writes this file into its directory):
    aws_cloud.py PORT REPORT_SOCKET STATE_FILE NODE...
Once it serves, it writes STATE_FILE: {"ca": ..., "instances": {node: id, ..., "fencing-host": id}}.
"""

import json
import os
import sys
import threading

PORT, REPORT, STATE = sys.argv[1:4]
NODES = sys.argv[4:]
FENCING_HOST = "fencing-host"
REGION = "us-east-1"
os.environ["TEST_PROXY_MODE"] = "true"
os.environ["MOTO_PORT"] = PORT

from http.server import ThreadingHTTPServer  # noqa: E402

import boto3  # noqa: E402
from moto.ec2.models.instances import InstanceBackend  # noqa: E402
from moto.instance_metadata import responses as metadata  # noqa: E402
from moto.moto_proxy.proxy3 import CertificateCreator, ProxyRequestHandler  # noqa: E402

import lab_power  # noqa: E402

NODE_OF = {}


def report(verb, node):
    lab_power.report(verb, node, REPORT)


original_stop = InstanceBackend.stop_instances
original_start = InstanceBackend.start_instances


def stop_instances(self, instance_ids):
    for instance_id in instance_ids:
        if instance_id in NODE_OF:
            report("off", NODE_OF[instance_id])
    return original_stop(self, instance_ids)


def start_instances(self, instance_ids):
    result = original_start(self, instance_ids)
    for instance_id in instance_ids:
        if instance_id in NODE_OF:
            report("on", NODE_OF[instance_id])
    return result


InstanceBackend.stop_instances = stop_instances
InstanceBackend.start_instances = start_instances

server = ThreadingHTTPServer(("127.0.0.1", int(PORT)), ProxyRequestHandler)
threading.Thread(target=server.serve_forever, daemon=True).start()

# The instances, made through the proxy as any client makes them.
os.environ["HTTPS_PROXY"] = f"http://127.0.0.1:{PORT}"
os.environ["AWS_CA_BUNDLE"] = CertificateCreator.cacert
ec2 = boto3.client("ec2", region_name=REGION, aws_access_key_id="lab", aws_secret_access_key="lab")
instances = {}
for name in NODES + [FENCING_HOST]:
    made = ec2.run_instances(
        ImageId="ami-12c6146b",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "Name", "Value": name}]}],
    )
    instances[name] = made["Instances"][0]["InstanceId"]
NODE_OF.update({i: n for n, i in instances.items() if n != FENCING_HOST})
metadata.INSTANCE_METADATA["instance-id"] = instances[FENCING_HOST]

partial = STATE + ".partial"
with open(partial, "w") as f:
    json.dump({"ca": CertificateCreator.cacert, "instances": instances}, f)
os.rename(partial, STATE)
threading.Event().wait()
