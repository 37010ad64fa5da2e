"""fbench backend plugin for TRL's SFTTrainer."""
