"""Alpaca loading, tokenization and packing into the one token stream every backend trains on."""
