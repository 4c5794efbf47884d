"""Users, permissions and the proofs of a secret: pure logic shared by the server and the client."""
