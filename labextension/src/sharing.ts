// Sharing this session with named colleagues (portal/session/sharing.py): the owner's Share panel (who has
// access, who is connected, what guests did, "Take back"), and for a guest a line in the top bar saying
// whose session this is. Only in a session the admin lets its owner share (portal.yaml sharing.groups).
import { showDialog, Dialog } from '@jupyterlab/apputils';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { api, state } from './api';

export interface Share {
  user: string | null;
  group: string | null;
  created: string | null;
}

export interface Sharing {
  shareable: boolean;
  groups: string[];
  owner?: string;
  session?: string;
  shares: Share[];
  connected: string[];
  visits: string[];
  message?: string;
}

/** The session's owner and the person looking at it (JupyterHub's page config). */
export function whoIsHere(): { owner: string; me: string; guest: boolean } {
  const owner = PageConfig.getOption('hubServerUser');
  const me = PageConfig.getOption('hubUser');
  return { owner, me, guest: Boolean(owner && me && owner !== me) };
}

function element<K extends keyof HTMLElementTagNameMap>(tag: K, props: { class?: string; text?: string } = {}): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (props.class) {
    node.className = props.class;
  }
  if (props.text !== undefined) {
    node.textContent = props.text;
  }
  return node;
}

/** The top bar's word to a guest: whose session this is, and what that means; once the owner takes
 * the share back, that she did (the session answers 403 from then on), instead of JupyterLab's own
 * "kernel died" or "connection lost". */
export class GuestBanner extends Widget {
  constructor(owner: string, me: string) {
    super();
    this.id = 'dsportal-guest-banner';
    this.addClass('dsportal-GuestBanner');
    this._owner = owner;
    this.node.textContent = `${owner}'s session: you (${me}) are a guest. What you run, runs as ${owner}.`;
    this.node.title = `${owner} shared this session with you and can take it back at any time.`;
    this._timer = window.setInterval(() => void this._check(), 5000);
  }

  dispose(): void {
    window.clearInterval(this._timer);
    super.dispose();
  }

  private async _check(): Promise<void> {
    const settings = ServerConnection.makeSettings();
    let status: number;
    try {
      status = (await ServerConnection.makeRequest(URLExt.join(settings.baseUrl, 'api/me'), {}, settings)).status;
    } catch {
      return;  // the network: JupyterLab says so itself
    }
    if (status !== 403 || this.hasClass('dsportal-mod-takenBack')) {
      return;
    }
    window.clearInterval(this._timer);
    this.addClass('dsportal-mod-takenBack');
    const words = `${this._owner} has taken back your access to this session. What you typed since then was not saved in it.`;
    this.node.textContent = words;
    state.takenBack = true;
    void showDialog({ title: 'Access taken back', body: words, buttons: [Dialog.okButton({ label: 'OK' })] });
  }

  private _owner: string;
  private _timer: number;
}

/** The owner's panel: share with a person, see who has access and who is connected, take it back. */
export class SharingPanel extends Widget {
  constructor() {
    super();
    this.id = 'dsportal-sharing';
    this.title.label = 'Share';
    this.title.caption = 'Share this session with a colleague';
    this.title.closable = true;
    this.addClass('dsportal-Sharing');
    const intro = element('p', { class: 'dsportal-Sharing-intro' });
    intro.textContent =
      'A person you share this session with can read and change your files and run code as you, ' +
      "inside this session's job, until you take it back. The share gives them none of your other " +
      "sessions, nor this session's Jobs panel, TensorBoards or VS Code; but code they run runs as you " +
      'and can do what you can. Share only with someone you would hand your keyboard to.';
    const form = element('form', { class: 'dsportal-Sharing-form' });
    this._name.name = 'user';
    this._name.placeholder = 'a user (bob), or a group (group:ml-lab)';
    this._name.className = 'jp-mod-styled';
    this._name.maxLength = 40;
    const submit = element('button', { class: 'jp-Button jp-mod-styled jp-mod-accept', text: 'Share' });
    submit.type = 'submit';
    form.append(this._name, submit);
    form.onsubmit = event => {
      event.preventDefault();
      void this._share();
    };
    this.node.append(
      intro,
      this._rule,
      form,
      this._message,
      element('h3', { text: 'Who has access' }),
      this._shares,
      element('h3', { text: 'Connected now' }),
      this._connected,
      element('h3', { text: "Guests' visits" }),
      this._visits
    );
    void this.refresh();
    this._timer = window.setInterval(() => void this.refresh(), 5000);
  }

  dispose(): void {
    window.clearInterval(this._timer);
    super.dispose();
  }

  async refresh(): Promise<void> {
    let sharing: Sharing;
    try {
      sharing = await api<Sharing>('GET', 'sharing');
    } catch (error) {
      this._say((error as Error).message, 'error');
      return;
    }
    state.sharing = sharing;
    if (!sharing.shareable) {
      this._rule.textContent = sharing.message || 'This session cannot be shared.';
      return;
    }
    this._rule.textContent = `You may share with members of: ${sharing.groups.join(', ')}.`;
    this._shares.textContent = '';
    if (sharing.shares.length === 0) {
      this._shares.append(element('li', { text: 'Nobody but you.' }));
    }
    for (const share of sharing.shares) {
      const who = share.user ?? share.group ?? '';
      const row = element('li', { class: 'dsportal-Sharing-share' });
      row.dataset.user = who;
      const back = element('button', { class: 'jp-Button jp-mod-styled jp-mod-warn dsportal-Sharing-takeBack', text: 'Take back' });
      back.onclick = () => void this._takeBack(share);
      row.append(element('span', { text: share.group ? `group ${who}` : who }), ' ', back);
      this._shares.append(row);
    }
    this._connected.textContent = sharing.connected.length ? sharing.connected.join(', ') : 'No guest.';
    this._visits.textContent = sharing.visits.length ? sharing.visits.join('\n') : 'None yet.';
  }

  private async _share(): Promise<void> {
    const name = this._name.value.trim();
    const target = name.startsWith('group:') ? { group: name.slice('group:'.length) } : { user: name };
    try {
      const answer = await api<{ message: string }>('POST', 'sharing', target);
      this._name.value = '';
      await this.refresh();
      this._say(answer.message, 'ok');
    } catch (error) {
      this._say((error as Error).message, 'error');
    }
  }

  private async _takeBack(share: Share): Promise<void> {
    const query = share.group ? `group=${encodeURIComponent(share.group)}` : `user=${encodeURIComponent(share.user ?? '')}`;
    try {
      const answer = await api<{ message: string }>('DELETE', `sharing?${query}`);
      await this.refresh();
      this._say(answer.message, 'ok');
    } catch (error) {
      this._say((error as Error).message, 'error');
    }
  }

  private _say(text: string, kind: 'ok' | 'error'): void {
    this._message.textContent = text;
    this._message.className = `dsportal-Sharing-message dsportal-Sharing-${kind}`;
  }

  private _timer: number;
  private _name = element('input');
  private _rule = element('p', { class: 'dsportal-Sharing-rule' });
  private _message = element('div', { class: 'dsportal-Sharing-message' });
  private _shares = element('ul', { class: 'dsportal-Sharing-shares' });
  private _connected = element('p', { class: 'dsportal-Sharing-connected' });
  private _visits = element('pre', { class: 'dsportal-Sharing-visits' });
}
