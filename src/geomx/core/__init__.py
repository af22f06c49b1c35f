"""The server core: rounds, clients and the interfaces that algorithms plug into. It knows no algorithm."""
