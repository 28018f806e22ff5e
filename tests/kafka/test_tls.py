"""TLS on the Kafka port: with QUEEN_KAFKA_TLS_CERT/KEY the listener speaks
only TLS, alone (SSL) or under SASL (SASL_SSL), with a certificate made
here by openssl."""

import subprocess

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from conftest import KafkaBroker, wait_for
from test_sasl import JWT, token


@pytest.fixture
def certs(tmp_path):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
                   check=True, capture_output=True)
    return {"QUEEN_KAFKA_TLS_CERT": str(tmp_path / "cert.pem"), "QUEEN_KAFKA_TLS_KEY": str(tmp_path / "key.pem")}


def roundtrip(conf, topic):
    p = Producer({**conf, "message.timeout.ms": 10000})
    delivered = []
    p.produce(topic, value=b"over tls", partition=0, on_delivery=lambda e, m: delivered.append(e))
    p.flush(20)
    assert delivered == [None]
    c = Consumer({**conf, "group.id": "tls", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    wait_for(lambda: (got.append(m.value()) if (m := c.poll(0.2)) is not None and not m.error() else None) or got, 30, "the record")
    c.close()
    assert got == [b"over tls"]


def test_ssl_and_sasl_ssl_clients_are_served_and_a_plaintext_one_is_not(tmp_path, certs):
    b = KafkaBroker(tmp_path, certs)
    try:
        ssl = {"bootstrap.servers": b.bootstrap, "security.protocol": "SSL", "ssl.ca.location": certs["QUEEN_KAFKA_TLS_CERT"]}
        roundtrip(ssl, "secret")
        errors = []
        plain = AdminClient({"bootstrap.servers": b.bootstrap, "error_cb": lambda e: errors.append(e)})
        with pytest.raises(Exception):
            plain.list_topics(timeout=3)
        wait_for(lambda: any("kafka TLS handshake failed" in line for line in b.logs), 10, "the refused handshake in the log")
    finally:
        b.stop()
    b = KafkaBroker(tmp_path, {**certs, **JWT})
    try:
        roundtrip({"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_SSL", "ssl.ca.location": certs["QUEEN_KAFKA_TLS_CERT"],
                   "sasl.mechanisms": "PLAIN", "sasl.username": "svc", "sasl.password": token("read-write")}, "secret")
    finally:
        b.stop()
