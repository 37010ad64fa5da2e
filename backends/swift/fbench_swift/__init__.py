"""fbench backend plugin for ms-swift's SFT pipeline (SwiftSft)."""
